// Reads an HTTP request body from civetweb within bounds: a declared Content-Length over the
// limit is refused before a byte is read, a body without one (chunked, or read until the
// connection closes) is refused once it passes the limit, and the whole body must arrive by a
// deadline, so a client trickling bytes cannot hold a worker thread for long.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct mg_connection;

namespace attnserve::transport {

// RESOURCE_EXHAUSTED when the body is (or declares to be) longer than `max_bytes` (HTTP 413);
// INVALID_ARGUMENT when it ends before its Content-Length or the connection fails;
// DEADLINE_EXCEEDED when it has not all arrived by `deadline`.
absl::StatusOr<std::string> ReadRequestBody(mg_connection* conn, int64_t max_bytes,
                                            absl::Time deadline);

}  // namespace attnserve::transport
