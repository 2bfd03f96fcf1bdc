// Checks, before any compute, that a call's answer will fit in one gRPC message: gRPC refuses
// to send a message over --max_message_bytes, so a legal Forward near the limit (its out is as
// large as q, plus lse) used to run to completion and then fail. The data path streams answers
// in chunks and needs no such check.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "server/engine/attention_request.h"

namespace attnserve::transport {

// Room for everything in an answer besides tensor bytes: shapes, dtypes, the Execution report,
// a context id and address, and protobuf framing (well under 1 KiB in practice).
inline constexpr int64_t kAnswerOverheadBytes = 4096;

// RESOURCE_EXHAUSTED naming max_message_bytes when out + lse would not fit. Requests whose
// shapes are malformed pass: validation rejects them with the field's name.
absl::Status CheckAnswerFits(const engine::ForwardInputs& inputs,
                                    int64_t max_message_bytes);
// dq + dk + dv, as far as the request shows them: with a context_id and only dout sent, dq
// (the size of dout) is what is known here.
absl::Status CheckAnswerFits(const engine::BackwardInputs& inputs,
                                     int64_t max_message_bytes);

}  // namespace attnserve::transport
