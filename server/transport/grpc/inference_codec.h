// Converts between the Open Inference Protocol's gRPC messages and the protocol-neutral
// oip::InferRequest / InferAnswer. Raw contents are viewed in place (the message must outlive
// the request); typed contents (fp32_contents, int_contents) are converted into owned bytes.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"
#include "server/transport/oip/infer_request.h"

namespace attnserve::transport {

absl::StatusOr<oip::InferRequest> DecodeInferRequest(const inference::ModelInferRequest& request);

// Moves the answer's tensor bytes into the response; returns how many.
int64_t EncodeInferAnswer(oip::InferAnswer answer, inference::ModelInferResponse* response);

}  // namespace attnserve::transport
