// Checks every request before any work: dtypes, shapes, byte counts, offsets, head ratio,
// options and the server's limits. Errors are INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a
// limit) with a message that names the offending field, e.g. "cu_seqlens_q[3] = 5 is less
// than cu_seqlens_q[2] = 9".
#pragma once

#include "absl/status/status.h"
#include "server/engine/attention_request.h"
#include "server/engine/limits.h"

namespace attnserve::engine {

// Largest |softmax_scale| accepted. Scores are computed in float32, so a scale near FLT_MAX
// (3.4e38) overflows them to inf and every output to NaN. 1/sqrt(head_dim) is below 1 and
// temperature-scaled attention stays within a few orders of magnitude of it; at this bound an
// fp16 input at head_dim 1024 (|q.k| <= 1024 * 65504^2 = 4.4e12) still scores below 1e17.
inline constexpr float kMaxSoftmaxScale = 1e4f;

absl::Status ValidateForward(const ForwardInputs& inputs, const Limits& limits);
absl::Status ValidateBackward(const BackwardInputs& inputs, const Limits& limits);

}  // namespace attnserve::engine
