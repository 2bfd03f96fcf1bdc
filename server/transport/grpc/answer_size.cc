#include "server/transport/grpc/answer_size.h"

#include "absl/strings/str_cat.h"

namespace attnserve::transport {
namespace {

absl::Status CheckFits(const char* what, int64_t tensor_bytes, int64_t max_message_bytes) {
  if (tensor_bytes + kAnswerOverheadBytes <= max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the answer (", what, ", ", tensor_bytes, " bytes) would exceed the server's limit "
      "max_message_bytes = ", max_message_bytes, "; send fewer tokens per call or use the data "
      "channel"));
}

}  // namespace

absl::Status CheckAnswerFits(const engine::ForwardInputs& in, int64_t max_message_bytes) {
  const engine::TensorView& q = in.q;
  const int64_t item = kernels::DTypeSize(q.dtype);
  if (q.shape.size() != 3 || q.shape[2] < 1 || item < 1) return absl::OkStatus();
  // From q's byte count, not its claimed shape: both are at most a message long, so nothing
  // here overflows, and a shape that disagrees with the bytes is validation's to name.
  const int64_t out_bytes = static_cast<int64_t>(q.size_bytes);
  const int64_t rows = out_bytes / (item * q.shape[2]);  // total_q * num_heads
  const int64_t lse_bytes = rows * static_cast<int64_t>(sizeof(float));
  return CheckFits("out + lse", out_bytes + lse_bytes, max_message_bytes);
}

absl::Status CheckAnswerFits(const engine::BackwardInputs& in,
                                     int64_t max_message_bytes) {
  const int64_t dq = static_cast<int64_t>(in.q.absent() ? in.dout.size_bytes : in.q.size_bytes);
  const int64_t dk_dv = static_cast<int64_t>(in.k.size_bytes + in.v.size_bytes);
  return CheckFits("dq + dk + dv", dq + dk_dv, max_message_bytes);
}

}  // namespace attnserve::transport
