#include "server/transport/http/rest_exchange.h"

#include <civetweb.h>

#include "absl/strings/str_cat.h"
#include "server/transport/http/rest_json.h"
#include "server/transport/http/rest_status.h"

namespace attnserve::transport {

RestResponse RestError(const absl::Status& status) {
  RestResponse response{HttpStatusFor(status), rest::ErrorBody(status.message())};
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    response.extra_headers = "WWW-Authenticate: Bearer\r\n";
  }
  return response;
}

std::optional<absl::string_view> RequestHeader(mg_connection* conn, const char* name) {
  const char* value = mg_get_header(conn, name);
  if (value == nullptr) return std::nullopt;
  return absl::string_view(value);
}

void SendResponse(mg_connection* conn, const RestResponse& response) {
  std::string headers = response.extra_headers;
  const char* content_type = "application/json";
  if (response.json_length.has_value()) {
    content_type = "application/octet-stream";
    absl::StrAppend(&headers, "Inference-Header-Content-Length: ", *response.json_length, "\r\n");
  }
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            response.status, mg_get_response_code_text(conn, response.status), content_type,
            response.body.size(), headers.c_str());
  mg_write(conn, response.body.data(), response.body.size());
}

}  // namespace attnserve::transport
