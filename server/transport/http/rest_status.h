// The HTTP status of a REST error, the one place absl codes become HTTP codes (as Triton's
// HTTP frontend answers them): 400 bad input, 401/403 authentication, 404 unknown model,
// region or endpoint, 409 a name in use, 413 a body over the limit (said by the caller, since
// RESOURCE_EXHAUSTED also means the concurrency limits: WithHttpStatus), 429 limits, 503
// unavailable, 504 past the deadline.
#pragma once

#include "absl/status/status.h"

namespace attnserve::transport {

// The status `status` carries (WithHttpStatus), else the one its code maps to.
int HttpStatusFor(const absl::Status& status);
// `status` answered with `http_status` rather than its code's (413 for RESOURCE_EXHAUSTED).
absl::Status WithHttpStatus(absl::Status status, int http_status);
// A ReadRequestBody refusal as answered: a body over the limit is 413 Payload Too Large.
absl::Status BodyRefusal(absl::Status status);

}  // namespace attnserve::transport
