// One REST request and its answer on a civetweb connection: reading headers, and writing the
// answer (JSON, or JSON then binary tensors with Inference-Header-Content-Length) or an error
// as `{"error": "..."}` with its HTTP status (rest_status.h).
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

struct mg_connection;

namespace attnserve::transport {

struct RestResponse {
  int status = 200;
  std::string body;  // JSON, then binary outputs when json_length is set
  std::optional<size_t> json_length;
  std::string extra_headers;  // each ending in \r\n
};

RestResponse RestError(const absl::Status& status);

// The request's header `name`, absent when not sent.
std::optional<absl::string_view> RequestHeader(mg_connection* conn, const char* name);

// Writes the answer and closes the exchange (Connection: close: a refused request's unread
// body must not be taken for the next request).
void SendResponse(mg_connection* conn, const RestResponse& response);

}  // namespace attnserve::transport
