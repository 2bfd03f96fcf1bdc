#include "server/transport/http/rest_status.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attnserve::transport {
namespace {

constexpr char kHttpStatusPayload[] = "attnserve.http_status";

int StatusOfCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    // Shared memory off (--allow_shared_memory) and kernels that cannot run the request: the
    // request cannot succeed on this server as it is.
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kCancelled:
      return 499;  // the client went away (nginx's code; Triton has none)
    default:
      return 500;
  }
}

}  // namespace

int HttpStatusFor(const absl::Status& status) {
  if (auto payload = status.GetPayload(kHttpStatusPayload)) {
    int http_status = 0;
    if (absl::SimpleAtoi(std::string(*payload), &http_status)) return http_status;
  }
  return StatusOfCode(status.code());
}

absl::Status WithHttpStatus(absl::Status status, int http_status) {
  status.SetPayload(kHttpStatusPayload, absl::Cord(absl::StrCat(http_status)));
  return status;
}

absl::Status BodyRefusal(absl::Status status) {
  if (!absl::IsResourceExhausted(status)) return status;
  return WithHttpStatus(std::move(status), 413);
}

}  // namespace attnserve::transport
