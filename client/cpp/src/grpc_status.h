// gRPC's status as absl's: the client's calls answer absl::Status on either transport.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace attnserve::internal {

inline absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace attnserve::internal
