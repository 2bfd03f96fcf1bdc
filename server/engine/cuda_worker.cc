#include "server/engine/cuda_worker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/flash/flash_attention.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {
namespace {

// The families this binary holds: the flash kernels are built whenever CUDA is.
constexpr KernelCatalog kCatalog{/*flash=*/true};

// Two lanes keep the copy engines and the SMs busy at once: while one request's inputs cross
// PCIe, the other's kernel runs.
constexpr int kLanesPerDevice = 2;

int ParseComputeCapability(const std::string& cc) {
  const size_t dot = cc.find('.');
  return std::stoi(cc.substr(0, dot)) * 10 + std::stoi(cc.substr(dot + 1));
}

HostBytes Bytes(const TensorView& t) { return {t.data, t.size_bytes}; }
HostBytes Bytes(const std::vector<int32_t>& v) { return {v.data(), v.size() * sizeof(int32_t)}; }

absl::Status FromKernel(const char* what, const kernels::KernelStatus& status) {
  if (status.ok) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", status.message));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaWorker>> CudaWorker::Create(devices::DeviceDescription device,
                                                               const EngineOptions& options,
                                                               metrics::ServerMetrics* metrics) {
  if (absl::Status s = CudaStatus(cudaSetDevice(device.ordinal), "cudaSetDevice"); !s.ok()) {
    return s;
  }
  // Keep freed device memory in the pool instead of returning it to the driver after every
  // request: requests of similar sizes then allocate without a driver call.
  cudaMemPool_t pool;
  if (absl::Status s = CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device.ordinal),
                                  "cudaDeviceGetDefaultMemPool");
      !s.ok()) {
    return s;
  }
  uint64_t keep_everything = UINT64_MAX;
  if (absl::Status s = CudaStatus(
          cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
          "cudaMemPoolSetAttribute");
      !s.ok()) {
    return s;
  }
  std::vector<std::unique_ptr<CudaLane>> lanes;
  for (int i = 0; i < kLanesPerDevice; ++i) {
    absl::StatusOr<std::unique_ptr<CudaLane>> lane = CudaLane::Create(device.ordinal);
    if (!lane.ok()) return lane.status();
    lanes.push_back(*std::move(lane));
  }
  return std::unique_ptr<CudaWorker>(
      new CudaWorker(std::move(device), options, metrics, std::move(lanes)));
}

CudaWorker::CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
                       metrics::ServerMetrics* metrics,
                       std::vector<std::unique_ptr<CudaLane>> lanes)
    : QueueWorker(device, options.batching, metrics),
      lanes_(std::move(lanes)),
      cpu_context_{options.cpu_threads},
      compute_capability_(ParseComputeCapability(device.compute_capability)),
      metrics_(metrics) {
  StartLanes(static_cast<int>(lanes_.size()));
}

CudaWorker::~CudaWorker() { Stop(); }

std::vector<std::string> CudaWorker::kernel_families() const {
  // The families the routing table can pick on this device for some request.
  std::vector<std::string> families;
  for (const std::string& family : KnownFamilies()) {
    for (Direction direction : {Direction::kForward, Direction::kBackward}) {
      const RouteQuery probe{compute_capability_, direction, DType::kBFloat16, 64};
      if (Covers(family, probe, kCatalog) &&
          std::find(families.begin(), families.end(), family) == families.end()) {
        families.push_back(family);
      }
    }
  }
  return families;
}

void CudaWorker::OnLaneStart(int lane) { cudaSetDevice(lanes_[lane]->ordinal()); }

std::string CudaWorker::FamilyFor(Direction direction, const TensorView& q) const {
  return ChooseRoute({compute_capability_, direction, q.dtype, static_cast<int>(q.shape[2])},
                     kCatalog)
      .family;
}

absl::StatusOr<ForwardResult> CudaWorker::Execute(const ForwardInputs& inputs, int lane) {
  if (FamilyFor(Direction::kForward, inputs.q) == "flash" && inputs.q.shape[0] > 0) {
    return RunFlashForward(inputs, *lanes_[lane]);
  }
  // The reference family runs on the host: Execution reports device "cpu".
  absl::StatusOr<ForwardResult> result = RunForward(kReferenceFamily, inputs, cpu_context_);
  if (result.ok()) result->execution.device = "cpu";
  return result;
}

absl::StatusOr<BackwardResult> CudaWorker::Execute(const BackwardInputs& inputs, int lane) {
  if (FamilyFor(Direction::kBackward, inputs.q) == "flash" && inputs.q.shape[0] > 0 &&
      inputs.k.shape[0] > 0) {
    return RunFlashBackward(inputs, *lanes_[lane]);
  }
  absl::StatusOr<BackwardResult> result = RunBackward(kReferenceFamily, inputs, cpu_context_);
  if (result.ok()) result->execution.device = "cpu";
  return result;
}

absl::StatusOr<ForwardResult> CudaWorker::RunFlashForward(const ForwardInputs& in,
                                                         CudaLane& lane) {
  kernels::ForwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  const size_t lse_bytes = sizeof(float) * params.shape.num_heads * params.shape.total_q;
  std::vector<std::string> outputs;
  float kernel_ms = 0;
  absl::Status status = lane.Run(
      {Bytes(in.q), Bytes(in.k), Bytes(in.v), Bytes(in.cu_seqlens_q), Bytes(in.cu_seqlens_k)},
      {in.q.size_bytes, lse_bytes}, /*workspace_bytes=*/0,
      [&](const DeviceBuffers& d, cudaStream_t stream) {
        params.q = d.inputs[0];
        params.k = d.inputs[1];
        params.v = d.inputs[2];
        params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(d.inputs[3]);
        params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(d.inputs[4]);
        params.out = d.outputs[0];
        params.lse = reinterpret_cast<float*>(d.outputs[1]);
        kernels::ExecutionContext ctx;
        ctx.stream = stream;
        return FromKernel("flash forward", kernels::flash::Forward(params, ctx));
      },
      &outputs, &kernel_ms);
  if (!status.ok()) return status;
  ForwardResult result;
  result.out = {in.q.dtype, in.q.shape, std::move(outputs[0])};
  result.lse = {DType::kFloat32, {params.shape.num_heads, params.shape.total_q},
                std::move(outputs[1])};
  result.execution.device = device().name;
  result.execution.kernel = "flash";
  result.execution.compute_us = static_cast<int64_t>(kernel_ms * 1000);
  PublishMemoryUse();
  return result;
}

absl::StatusOr<BackwardResult> CudaWorker::RunFlashBackward(const BackwardInputs& in,
                                                           CudaLane& lane) {
  kernels::BackwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  params.deterministic = in.deterministic;
  std::vector<std::string> outputs;
  float kernel_ms = 0;
  absl::Status status = lane.Run(
      {Bytes(in.dout), Bytes(in.q), Bytes(in.k), Bytes(in.v), Bytes(in.out), Bytes(in.lse),
       Bytes(in.cu_seqlens_q), Bytes(in.cu_seqlens_k)},
      {in.q.size_bytes, in.k.size_bytes, in.v.size_bytes},
      kernels::flash::BackwardWorkspaceBytes(params),
      [&](const DeviceBuffers& d, cudaStream_t stream) {
        params.dout = d.inputs[0];
        params.q = d.inputs[1];
        params.k = d.inputs[2];
        params.v = d.inputs[3];
        params.out = d.inputs[4];
        params.lse = reinterpret_cast<const float*>(d.inputs[5]);
        params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(d.inputs[6]);
        params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(d.inputs[7]);
        params.dq = d.outputs[0];
        params.dk = d.outputs[1];
        params.dv = d.outputs[2];
        kernels::ExecutionContext ctx;
        ctx.stream = stream;
        ctx.workspace = d.workspace;
        ctx.workspace_bytes = kernels::flash::BackwardWorkspaceBytes(params);
        return FromKernel("flash backward", kernels::flash::Backward(params, ctx));
      },
      &outputs, &kernel_ms);
  if (!status.ok()) return status;
  BackwardResult result;
  result.dq = {in.q.dtype, in.q.shape, std::move(outputs[0])};
  result.dk = {in.k.dtype, in.k.shape, std::move(outputs[1])};
  result.dv = {in.v.dtype, in.v.shape, std::move(outputs[2])};
  result.execution.device = device().name;
  result.execution.kernel = "flash";
  result.execution.compute_us = static_cast<int64_t>(kernel_ms * 1000);
  PublishMemoryUse();
  return result;
}

void CudaWorker::PublishMemoryUse() {
  if (metrics_ == nullptr) return;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    metrics_->SetDeviceMemoryUsed(device().name, static_cast<double>(total_bytes - free_bytes));
  }
}

}  // namespace attnserve::engine
