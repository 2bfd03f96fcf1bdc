// Checks every request before any work: dtypes, shapes, byte counts, offsets, head ratio,
// options and the server's limits. Errors are INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a
// limit) with a message that names the offending field, e.g. "cu_seqlens_q[3] = 5 is less
// than cu_seqlens_q[2] = 9".
#pragma once

#include "absl/status/status.h"
#include "server/engine/attention_request.h"
#include "server/engine/limits.h"

namespace attnserve::engine {

absl::Status ValidateForward(const ForwardInputs& inputs, const Limits& limits);
absl::Status ValidateBackward(const BackwardInputs& inputs, const Limits& limits);

}  // namespace attnserve::engine
