#include "server/transport/data/request_plan.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/request_validation.h"
#include "server/transport/data/frame.h"
#include "server/transport/grpc/proto_codec.h"

namespace attnserve::transport::data {
namespace {

// One tensor field of the call: its message, whether it was sent, its engine view.
struct TensorField {
  const v1::Tensor* message;
  bool present;
  const char* name;
};

std::vector<TensorField> Fields(const v1::DataRequest& request) {
  if (request.has_forward()) {
    const v1::ForwardRequest& r = request.forward();
    return {{&r.q(), r.has_q(), "q"}, {&r.k(), r.has_k(), "k"}, {&r.v(), r.has_v(), "v"}};
  }
  const v1::BackwardRequest& r = request.backward();
  return {{&r.dout(), r.has_dout(), "dout"}, {&r.q(), r.has_q(), "q"},
          {&r.k(), r.has_k(), "k"},          {&r.v(), r.has_v(), "v"},
          {&r.out(), r.has_out(), "out"},    {&r.lse(), r.has_lse(), "lse"}};
}

std::vector<engine::TensorView*> Views(
    std::variant<engine::ForwardInputs, engine::BackwardInputs>& inputs) {
  if (auto* f = std::get_if<engine::ForwardInputs>(&inputs)) return {&f->q, &f->k, &f->v};
  auto& b = std::get<engine::BackwardInputs>(inputs);
  return {&b.dout, &b.q, &b.k, &b.v, &b.out, &b.lse};
}

// dtype size x shape, or an error naming the field: negative dimensions, or more bytes than
// `max_bytes` (checked at every step, so the product never overflows).
absl::StatusOr<int64_t> TensorBytes(const engine::TensorView& view, const char* name,
                                    int64_t max_bytes) {
  for (int64_t d : view.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ".shape: dimensions must be non-negative, got [",
                                                     absl::StrJoin(view.shape, ", "), "]"));
    }
    if (d == 0) return 0;
  }
  int64_t bytes = kernels::DTypeSize(view.dtype);
  for (int64_t d : view.shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name, ": shape [", absl::StrJoin(view.shape, ", "), "] of ",
          kernels::DTypeName(view.dtype), " exceeds the server's limit max_message_bytes = ",
          max_bytes));
    }
  }
  return bytes;
}

}  // namespace

void PlannedCall::PointInto(const char* base) {
  std::vector<engine::TensorView*> views = Views(inputs);
  for (const Slice& slice : slices) views[slice.tensor]->data = base + slice.offset;
}

const char* RpcName(const v1::DataRequest& request) {
  if (request.has_forward()) return "Forward";
  if (request.has_backward()) return "Backward";
  return nullptr;
}

absl::StatusOr<PlannedCall> PlanCall(const v1::DataRequest& request, const engine::Limits& limits,
                                     int64_t max_chunk_bytes) {
  if (RpcName(request) == nullptr) {
    return absl::InvalidArgumentError("DataRequest.call: set forward or backward");
  }
  const std::vector<TensorField> fields = Fields(request);
  for (const TensorField& field : fields) {
    if (!field.message->data().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field.name, ".data: must be empty on the data channel (tensor bytes travel in CHUNK "
          "frames), got ", field.message->data().size(), " bytes"));
    }
  }
  PlannedCall call;
  if (request.has_forward()) {
    absl::StatusOr<engine::ForwardInputs> inputs = DecodeForward(request.forward());
    if (!inputs.ok()) return inputs.status();
    call.inputs = *std::move(inputs);
  } else {
    absl::StatusOr<engine::BackwardInputs> inputs = DecodeBackward(request.backward());
    if (!inputs.ok()) return inputs.status();
    call.inputs = *std::move(inputs);
  }

  // The payload: present tensors in field order, as large in all as a gRPC message may be.
  const int64_t message_bytes = static_cast<int64_t>(request.ByteSizeLong());
  const int64_t max_payload = limits.max_message_bytes - message_bytes;
  std::vector<engine::TensorView*> views = Views(call.inputs);
  std::vector<std::string> parts;
  int64_t total = 0;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (!fields[i].present) continue;
    absl::StatusOr<int64_t> bytes = TensorBytes(*views[i], fields[i].name, limits.max_message_bytes);
    if (!bytes.ok()) return bytes.status();
    call.slices.push_back({static_cast<int>(i), total, *bytes});
    views[i]->size_bytes = static_cast<size_t>(*bytes);
    views[i]->data = nullptr;
    total += *bytes;  // each term <= max_message_bytes <= 2^31: no overflow
    parts.push_back(absl::StrCat(fields[i].name, ": ", *bytes));
  }
  if (total > max_payload) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "payload_bytes: the request's tensors need ", total, " bytes (", absl::StrJoin(parts, ", "),
        ") beside a ", message_bytes, "-byte message, over the server's limit max_message_bytes = ",
        limits.max_message_bytes));
  }
  if (request.payload_bytes() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload_bytes: ", request.payload_bytes(),
                     " does not match the tensors' dtypes and shapes, which need ", total));
  }
  call.payload_bytes = total;
  if (request.chunk_bytes() < kMinChunkBytes || request.chunk_bytes() > max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes: ", request.chunk_bytes(),
                                                   " is not in ", kMinChunkBytes, "..",
                                                   max_chunk_bytes, " (max_chunk_bytes)"));
  }
  call.chunk_bytes = request.chunk_bytes();
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: must be >= 0 (0 = the server's cap), got ", request.timeout_ms()));
  }
  if (request.timeout_ms() > 0) call.timeout = absl::Milliseconds(request.timeout_ms());
  if (!request.priority().empty()) {
    absl::StatusOr<engine::Priority> priority = engine::ParsePriority(request.priority());
    if (!priority.ok()) return priority.status();
    call.priority = *priority;
  }
  // A backward on a saved context is checked by the engine once it has filled the context's
  // tensors in (Enqueue); here its payload size, from dout's shape, is all there is to check.
  if (call.backward()) {
    const engine::BackwardInputs& inputs = std::get<engine::BackwardInputs>(call.inputs);
    if (inputs.context_id.empty()) {
      if (absl::Status valid = engine::ValidateBackward(inputs, limits); !valid.ok()) return valid;
    }
  } else if (absl::Status valid = engine::ValidateForward(
                 std::get<engine::ForwardInputs>(call.inputs), limits);
             !valid.ok()) {
    return valid;
  }
  return call;
}

}  // namespace attnserve::transport::data
