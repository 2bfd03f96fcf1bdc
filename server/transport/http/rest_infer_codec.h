// Converts between the Open Inference Protocol's REST inference bodies (POST
// /v2/models/<m>/infer) and the protocol-neutral oip::InferRequest / InferAnswer: a JSON
// document, optionally followed by the binary tensors of Triton's binary-tensor extension (the
// JSON's length in the Inference-Header-Content-Length header; inputs with a `binary_data_size`
// parameter take their bytes from there, in order; outputs asked for with `binary_data` or a
// request-wide `binary_data_output` go there in the answer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/transport/oip/infer_request.h"

namespace attnserve::transport::rest {

// Parses an inference body. `json_length`: the Inference-Header-Content-Length value (absent:
// the whole body is JSON, and no input may be binary). A JSON document longer than
// `max_json_bytes` is refused with RESOURCE_EXHAUSTED (its parsed form takes several times its
// size; large tensors belong in the binary part). Binary inputs are views into `body`, which
// must outlive the request; JSON data is converted into owned bytes. The model's name and
// version come from the URL and are left empty. Errors are INVALID_ARGUMENT naming the field.
absl::StatusOr<oip::InferRequest> DecodeInferBody(absl::string_view body,
                                                  std::optional<int64_t> json_length,
                                                  int64_t max_json_bytes);

struct EncodedAnswer {
  std::string body;  // the JSON, then the binary outputs, if any
  // The JSON's length when binary outputs follow it (the Inference-Header-Content-Length
  // header); absent when the body is only JSON.
  std::optional<size_t> json_length;
  int64_t tensor_bytes = 0;  // output bytes sent (binary or as JSON numbers)
};

// The answer as the REST body `request` asked for: each output in binary when its
// `binary_data` parameter says so, else when the request's `binary_data_output` does, else as
// JSON numbers (non-finite values, such as the lse of a row without visible keys, cannot be
// JSON numbers and become null: ask for binary outputs to keep them).
EncodedAnswer EncodeInferAnswer(oip::InferAnswer answer, const oip::InferRequest& request);

}  // namespace attnserve::transport::rest
