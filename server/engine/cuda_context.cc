#include "server/engine/cuda_context.h"

#include <array>
#include <string>

namespace attnserve::engine {
namespace {

class ForwardBufferContext : public ContextMemory {
 public:
  explicit ForwardBufferContext(std::unique_ptr<KeptDeviceMemory> kept) : kept_(std::move(kept)) {}
  int64_t bytes() const override { return static_cast<int64_t>(kept_->bytes()); }
  bool on_host() const override { return false; }
  const char* address(ContextTensor tensor) const override {
    const DeviceBuffers& b = kept_->buffers();
    switch (tensor) {
      case ContextTensor::kQ:
        return b.inputs[0];
      case ContextTensor::kK:
        return b.inputs[1];
      case ContextTensor::kV:
        return b.inputs[2];
      case ContextTensor::kCuSeqlensQ:
        return b.inputs[3];
      case ContextTensor::kCuSeqlensK:
        return b.inputs[4];
      case ContextTensor::kOut:
        return b.outputs[0];
      case ContextTensor::kLse:
        return b.outputs[1];
    }
    return nullptr;
  }

 private:
  std::unique_ptr<KeptDeviceMemory> kept_;
};

}  // namespace

std::unique_ptr<ContextMemory> ContextInForwardBuffer(std::unique_ptr<KeptDeviceMemory> kept) {
  return std::make_unique<ForwardBufferContext>(std::move(kept));
}

absl::StatusOr<std::unique_ptr<ContextMemory>> CopyToHost(const SavedContext& context) {
  const ContextSpec& spec = context.spec;
  ForwardInputs forward;
  ForwardResult result;
  std::array<std::string, 5> host;
  auto count = [](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  };
  const int64_t item = kernels::DTypeSize(spec.dtype);
  const struct {
    ContextTensor tensor;
    int64_t bytes;
  } tensors[] = {{ContextTensor::kQ, item * count(spec.q_shape)},
                 {ContextTensor::kK, item * count(spec.k_shape)},
                 {ContextTensor::kV, item * count(spec.k_shape)},
                 {ContextTensor::kOut, item * count(spec.q_shape)},
                 {ContextTensor::kLse, static_cast<int64_t>(sizeof(float)) * count(spec.lse_shape())}};
  for (size_t i = 0; i < host.size(); ++i) {
    host[i].resize(tensors[i].bytes);
    if (tensors[i].bytes == 0) continue;
    if (absl::Status s = CudaStatus(cudaMemcpy(host[i].data(), context.memory->address(tensors[i].tensor),
                                               host[i].size(), cudaMemcpyDeviceToHost),
                                    "cudaMemcpy (context to host)");
        !s.ok()) {
      return s;
    }
  }
  // SaveOnHost lays the host copy out; the offsets come from the spec, not the device.
  forward.q = {spec.dtype, spec.q_shape, host[0].data(), host[0].size()};
  forward.k = {spec.dtype, spec.k_shape, host[1].data(), host[1].size()};
  forward.v = {spec.dtype, spec.k_shape, host[2].data(), host[2].size()};
  forward.cu_seqlens_q = spec.cu_seqlens_q;
  forward.cu_seqlens_k = spec.cu_seqlens_k;
  result.out.data = std::move(host[3]);
  result.lse.data = std::move(host[4]);
  return SaveOnHost(forward, result);
}

}  // namespace attnserve::engine
