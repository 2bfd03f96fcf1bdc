// gRPC server settings that bound what a client can make the server spend before a call
// reaches the service (and before authentication): compressed messages, header blocks and
// connections that never finish their handshake. Debian's gRPC 1.51 lacks the upstream fixes
// for these (README, "What to put in front").
#pragma once

#include <grpcpp/server_builder.h>

#include "absl/time/time.h"

namespace attnserve {

struct GrpcAbuseLimits {
  // Largest header block (all metadata of one call) a call may carry, in bytes; larger ones
  // fail the call with RESOURCE_EXHAUSTED. gRPC 1.51's own default, stated so it cannot drift.
  // It does not stop a CONTINUATION flood (upstream CVE-2023-33953): 1.51 still buffers and
  // re-parses an oversized header block to its end, at a cost quadratic in its size, so a
  // proxy in front must bound header blocks (README).
  int max_metadata_bytes = 8 << 10;
  // A connection must finish its TLS / HTTP/2 handshake within this.
  absl::Duration handshake_timeout = absl::Seconds(10);
};

void ApplyGrpcAbuseLimits(const GrpcAbuseLimits& limits, grpc::ServerBuilder& builder);

}  // namespace attnserve
