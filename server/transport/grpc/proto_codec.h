// Converts between the wire's messages and the engine's request/result types. Decoding makes
// views into the request's bytes (no tensor copy); encoding moves the result's bytes into the
// response (no tensor copy). Only the dtype enum is checked here; ValidateForward/Backward in
// the engine checks everything else.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "server/engine/attention_request.h"

namespace attnserve::transport {

absl::StatusOr<engine::ForwardInputs> DecodeForward(const v1::ForwardRequest& request);
absl::StatusOr<engine::BackwardInputs> DecodeBackward(const v1::BackwardRequest& request);

// Both return the tensor bytes written into the response.
int64_t EncodeForward(engine::ForwardResult result, v1::ForwardResponse* response);
int64_t EncodeBackward(engine::BackwardResult result, v1::BackwardResponse* response);

// Tensor bytes a request carries, for the received-bytes metric.
int64_t TensorBytes(const v1::ForwardRequest& request);
int64_t TensorBytes(const v1::BackwardRequest& request);

}  // namespace attnserve::transport
