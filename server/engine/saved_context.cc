#include "server/engine/saved_context.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "server/engine/error_text.h"

namespace attnserve::engine {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return QuoteList<int64_t>(shape);
}

int64_t ByteCount(DType dtype, const std::vector<int64_t>& shape) {
  int64_t bytes = kernels::DTypeSize(dtype);
  for (int64_t d : shape) bytes *= d;
  return bytes;
}

// One host buffer, the tensors one after another in ContextTensor order.
class HostContextMemory : public ContextMemory {
 public:
  HostContextMemory(const std::array<std::string_view, kContextTensors>& parts) {
    size_t total = 0;
    for (std::string_view part : parts) total += part.size();
    bytes_.reserve(total);
    for (size_t i = 0; i < parts.size(); ++i) {
      offsets_[i] = bytes_.size();
      bytes_.append(parts[i].data(), parts[i].size());
    }
  }
  int64_t bytes() const override { return static_cast<int64_t>(bytes_.size()); }
  bool on_host() const override { return true; }
  const char* address(ContextTensor tensor) const override {
    return bytes_.data() + offsets_[static_cast<int>(tensor)];
  }

 private:
  std::string bytes_;
  std::array<size_t, kContextTensors> offsets_{};
};

std::string_view BytesOf(const TensorView& t) { return {t.data, t.size_bytes}; }
std::string_view BytesOf(const std::vector<int32_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t)};
}

absl::Status CheckTensor(const TensorView& sent, const char* name, DType dtype,
                         const std::vector<int64_t>& shape) {
  if (sent.absent()) return absl::OkStatus();
  if (sent.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".dtype: ", kernels::DTypeName(sent.dtype), " disagrees with the context's ",
        kernels::DTypeName(dtype)));
  }
  if (sent.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".shape: ", ShapeString(sent.shape),
                                                   " disagrees with the context's ",
                                                   ShapeString(shape)));
  }
  return absl::OkStatus();
}

absl::Status CheckOffsets(const std::vector<int32_t>& sent, const char* name,
                          const std::vector<int32_t>& saved) {
  if (sent.empty() || sent == saved) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", QuoteList<int32_t>(sent), " disagrees with the context's ",
                   QuoteList<int32_t>(saved)));
}

TensorView ViewOf(const SavedContext& context, ContextTensor tensor, DType dtype,
                  std::vector<int64_t> shape) {
  TensorView view;
  view.dtype = dtype;
  view.size_bytes = static_cast<size_t>(ByteCount(dtype, shape));
  view.shape = std::move(shape);
  view.data = context.memory->on_host() ? context.memory->address(tensor) : nullptr;
  return view;
}

}  // namespace

ContextSpec ContextSpec::Of(const ForwardInputs& forward) {
  ContextSpec spec;
  spec.dtype = forward.q.dtype;
  spec.q_shape = forward.q.shape;
  spec.k_shape = forward.k.shape;
  spec.cu_seqlens_q = forward.cu_seqlens_q;
  spec.cu_seqlens_k = forward.cu_seqlens_k;
  spec.options = forward.options;
  return spec;
}

std::unique_ptr<ContextMemory> SaveOnHost(const ForwardInputs& forward,
                                          const ForwardResult& result) {
  return std::make_unique<HostContextMemory>(std::array<std::string_view, kContextTensors>{
      BytesOf(forward.q), BytesOf(forward.k), BytesOf(forward.v), result.out.data,
      result.lse.data, BytesOf(forward.cu_seqlens_q), BytesOf(forward.cu_seqlens_k)});
}

absl::Status CheckAgreesWithContext(const BackwardInputs& in, const ContextSpec& spec) {
  const struct {
    const TensorView* sent;
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  } tensors[] = {{&in.q, "q", spec.dtype, spec.q_shape},
                 {&in.k, "k", spec.dtype, spec.k_shape},
                 {&in.v, "v", spec.dtype, spec.k_shape},
                 {&in.out, "out", spec.dtype, spec.q_shape},
                 {&in.lse, "lse", DType::kFloat32, spec.lse_shape()}};
  for (const auto& t : tensors) {
    if (absl::Status s = CheckTensor(*t.sent, t.name, t.dtype, t.shape); !s.ok()) return s;
  }
  if (absl::Status s = CheckOffsets(in.cu_seqlens_q, "cu_seqlens_q", spec.cu_seqlens_q);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckOffsets(in.cu_seqlens_k, "cu_seqlens_k", spec.cu_seqlens_k);
      !s.ok()) {
    return s;
  }
  // Options are a message of plain fields: all defaults is what a client that sends none
  // produces, so only other values must match.
  if (!SameOptionsButSeed(in.options, RequestOptions{}) &&
      !SameOptionsButSeed(in.options, spec.options)) {
    return absl::InvalidArgumentError(
        "options: disagree with the options of the forward that kept the context");
  }
  // The context holds the seed its forward used (the server's pick included); 0 = not sent.
  if (in.options.dropout_seed != 0 && in.options.dropout_seed != spec.options.dropout_seed) {
    return absl::InvalidArgumentError(
        absl::StrCat("dropout_seed: ", in.options.dropout_seed,
                     " disagrees with the seed of the forward that kept the context, ",
                     spec.options.dropout_seed));
  }
  return absl::OkStatus();
}

void FillFromContext(const SavedContext& context, BackwardInputs& in) {
  const ContextSpec& spec = context.spec;
  in.q = ViewOf(context, ContextTensor::kQ, spec.dtype, spec.q_shape);
  in.k = ViewOf(context, ContextTensor::kK, spec.dtype, spec.k_shape);
  in.v = ViewOf(context, ContextTensor::kV, spec.dtype, spec.k_shape);
  in.out = ViewOf(context, ContextTensor::kOut, spec.dtype, spec.q_shape);
  in.lse = ViewOf(context, ContextTensor::kLse, DType::kFloat32, spec.lse_shape());
  in.cu_seqlens_q = spec.cu_seqlens_q;
  in.cu_seqlens_k = spec.cu_seqlens_k;
  in.options = spec.options;
}

void AllocateContextOutputs(BackwardInputs& in) {
  OutputSpace& space = in.output_space;
  if (!space.allocate) return;
  space.destinations.resize(std::max<size_t>(space.destinations.size(), 3), nullptr);
  const size_t sizes[] = {0, in.k.size_bytes, in.v.size_bytes};
  for (size_t output : {1, 2}) {
    if (space.destinations[output] == nullptr) {
      space.destinations[output] = space.allocate(output, sizes[output]);
    }
  }
}

int64_t ContextBackwardDeviceBytes(const BackwardInputs& in) {
  const int64_t outputs = in.q.size_bytes + in.k.size_bytes + in.v.size_bytes;
  return static_cast<int64_t>(in.dout.size_bytes) + outputs +
         static_cast<int64_t>(in.lse.size_bytes);
}

}  // namespace attnserve::engine
