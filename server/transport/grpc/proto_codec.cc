#include "server/transport/grpc/proto_codec.h"

#include <initializer_list>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace attnserve::transport {
namespace {

using engine::DType;

absl::StatusOr<DType> DecodeDType(v1::DType dtype, const char* name) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          name, ".dtype: must be DTYPE_FLOAT16, DTYPE_BFLOAT16 or DTYPE_FLOAT32, got ",
          v1::DType_IsValid(dtype) ? v1::DType_Name(dtype) : absl::StrCat(static_cast<int>(dtype))));
  }
}

v1::DType EncodeDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<engine::TensorView> DecodeTensor(const v1::Tensor& tensor, const char* name) {
  absl::StatusOr<DType> dtype = DecodeDType(tensor.dtype(), name);
  if (!dtype.ok()) return dtype.status();
  engine::TensorView view;
  view.dtype = *dtype;
  view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  view.data = tensor.data().data();
  view.size_bytes = tensor.data().size();
  return view;
}

absl::StatusOr<engine::RequestOptions> DecodeOptions(const v1::AttentionOptions& options,
                                                     uint64_t dropout_seed) {
  engine::RequestOptions out;
  out.softmax_scale = options.softmax_scale();
  out.causal = options.causal();
  if (options.has_window_left()) out.window_left = options.window_left();
  if (options.has_window_right()) out.window_right = options.window_right();
  out.softcap = options.softcap();
  out.dropout_p = options.dropout_p();
  out.dropout_seed = dropout_seed;
  if (options.has_alibi_slopes()) {
    // Copied: a few floats, and a kept context must outlive the request's bytes.
    const v1::Tensor& slopes = options.alibi_slopes();
    if (slopes.dtype() != v1::DTYPE_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.alibi_slopes.dtype: must be DTYPE_FLOAT32, got ",
          v1::DType_IsValid(slopes.dtype()) ? v1::DType_Name(slopes.dtype())
                                            : absl::StrCat(static_cast<int>(slopes.dtype()))));
    }
    out.alibi_slopes = engine::OwnedTensor{
        DType::kFloat32, {slopes.shape().begin(), slopes.shape().end()}, slopes.data()};
  }
  return out;
}

int64_t EncodeTensor(engine::OwnedTensor tensor, v1::Tensor* out) {
  out->set_dtype(EncodeDType(tensor.dtype));
  out->mutable_shape()->Assign(tensor.shape.begin(), tensor.shape.end());
  const int64_t bytes = static_cast<int64_t>(tensor.data.size());
  out->set_data(std::move(tensor.data));
  return bytes;
}

void EncodeExecution(const engine::ExecutionReport& report, v1::Execution* out) {
  out->set_device(report.device);
  out->set_kernel(report.kernel);
  out->set_queue_us(report.queue_us);
  out->set_compute_us(report.compute_us);
  out->set_batched_requests(report.batched_requests);
  out->set_code_path(report.code_path);
}

// Decodes each named tensor into its view, stopping at the first error. A tensor field that is
// not set stays an absent view (empty shape, null data): the engine decides whether it may be.
absl::Status DecodeTensors(
    std::initializer_list<std::tuple<const v1::Tensor*, const char*, engine::TensorView*>> list) {
  for (const auto& [tensor, name, view] : list) {
    if (tensor == nullptr) continue;
    absl::StatusOr<engine::TensorView> decoded = DecodeTensor(*tensor, name);
    if (!decoded.ok()) return decoded.status();
    *view = *std::move(decoded);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<engine::ForwardInputs> DecodeForward(const v1::ForwardRequest& request) {
  engine::ForwardInputs in;
  if (absl::Status s = DecodeTensors({{&request.q(), "q", &in.q},
                                      {&request.k(), "k", &in.k},
                                      {&request.v(), "v", &in.v}});
      !s.ok()) {
    return s;
  }
  in.cu_seqlens_q.assign(request.cu_seqlens_q().begin(), request.cu_seqlens_q().end());
  in.cu_seqlens_k.assign(request.cu_seqlens_k().begin(), request.cu_seqlens_k().end());
  absl::StatusOr<engine::RequestOptions> options =
      DecodeOptions(request.options(), request.dropout_seed());
  if (!options.ok()) return options.status();
  in.options = *std::move(options);
  in.keep_context = request.keep_context();
  return in;
}

absl::StatusOr<engine::BackwardInputs> DecodeBackward(const v1::BackwardRequest& request) {
  engine::BackwardInputs in;
  auto field = [](bool set, const v1::Tensor& tensor) { return set ? &tensor : nullptr; };
  if (absl::Status s =
          DecodeTensors({{field(request.has_dout(), request.dout()), "dout", &in.dout},
                         {field(request.has_q(), request.q()), "q", &in.q},
                         {field(request.has_k(), request.k()), "k", &in.k},
                         {field(request.has_v(), request.v()), "v", &in.v},
                         {field(request.has_out(), request.out()), "out", &in.out},
                         {field(request.has_lse(), request.lse()), "lse", &in.lse}});
      !s.ok()) {
    return s;
  }
  in.cu_seqlens_q.assign(request.cu_seqlens_q().begin(), request.cu_seqlens_q().end());
  in.cu_seqlens_k.assign(request.cu_seqlens_k().begin(), request.cu_seqlens_k().end());
  absl::StatusOr<engine::RequestOptions> options =
      DecodeOptions(request.options(), request.dropout_seed());
  if (!options.ok()) return options.status();
  in.options = *std::move(options);
  in.deterministic = request.deterministic();
  in.context_id = request.context_id();
  in.keep_context = request.keep_context();
  return in;
}

int64_t EncodeForward(engine::ForwardResult result, v1::ForwardResponse* response) {
  EncodeExecution(result.execution, response->mutable_execution());
  response->set_context_id(std::move(result.context_id));
  response->set_dropout_seed(result.dropout_seed);
  return EncodeTensor(std::move(result.out), response->mutable_out()) +
         EncodeTensor(std::move(result.lse), response->mutable_lse());
}

int64_t EncodeBackward(engine::BackwardResult result, v1::BackwardResponse* response) {
  EncodeExecution(result.execution, response->mutable_execution());
  return EncodeTensor(std::move(result.dq), response->mutable_dq()) +
         EncodeTensor(std::move(result.dk), response->mutable_dk()) +
         EncodeTensor(std::move(result.dv), response->mutable_dv());
}

int64_t TensorBytes(const v1::ForwardRequest& r) {
  return static_cast<int64_t>(r.q().data().size() + r.k().data().size() + r.v().data().size());
}

int64_t TensorBytes(const v1::BackwardRequest& r) {
  return static_cast<int64_t>(r.dout().data().size() + r.q().data().size() +
                              r.k().data().size() + r.v().data().size() +
                              r.out().data().size() + r.lse().data().size());
}

}  // namespace attnserve::transport
