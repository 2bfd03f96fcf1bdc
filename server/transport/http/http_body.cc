#include "server/transport/http/http_body.h"

#include <civetweb.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attnserve::transport {
namespace {

// Bytes asked of civetweb per read: large enough for few calls, small enough that an
// undeclared body never overshoots the limit by much before it is refused.
constexpr int64_t kReadBytes = int64_t{1} << 20;

}  // namespace

absl::StatusOr<std::string> ReadRequestBody(mg_connection* conn, int64_t max_bytes,
                                            absl::Time deadline) {
  const int64_t declared = mg_get_request_info(conn)->content_length;  // -1: none
  if (declared > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("request body: Content-Length ", declared,
                                                     " exceeds the server's ", max_bytes,
                                                     " bytes (--max_message_bytes)"));
  }
  std::string body;
  // A declared length is only reserved, not touched, so a client that lies about it costs
  // address space until the read fails, not memory.
  if (declared > 0) body.reserve(static_cast<size_t>(declared));
  while (true) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("request body: ", body.size(), " bytes had arrived by the call's deadline"));
    }
    // Read one byte past the limit, to tell a body of exactly max_bytes from a longer one.
    const int64_t room = max_bytes + 1 - static_cast<int64_t>(body.size());
    const size_t want = static_cast<size_t>(std::min(kReadBytes, room));
    const size_t have = body.size();
    body.resize(have + want);
    const int n = mg_read(conn, body.data() + have, want);
    body.resize(have + static_cast<size_t>(std::max(n, 0)));
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("request body: the connection failed after ", body.size(), " bytes"));
    }
    if (static_cast<int64_t>(body.size()) > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("request body: longer than the server's ",
                                                       max_bytes, " bytes (--max_message_bytes)"));
    }
    if (n == 0) break;
  }
  if (declared >= 0 && static_cast<int64_t>(body.size()) < declared) {
    return absl::InvalidArgumentError(absl::StrCat("request body: ended after ", body.size(),
                                                   " of its Content-Length ", declared, " bytes"));
  }
  return body;
}

}  // namespace attnserve::transport
