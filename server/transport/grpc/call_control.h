// What the engine needs to know of a gRPC call besides its tensors: its deadline (the client's,
// capped by --max_deadline_seconds), whether it was cancelled, who calls, and its
// x-attnserve-priority. Shared by the native AttentionService and the inference protocol.
#pragma once

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/transport/auth/authenticator.h"

namespace attnserve::transport {

// INVALID_ARGUMENT names an x-attnserve-priority value it does not know. `context` must
// outlive the job (the cancellation check reads it).
absl::StatusOr<engine::JobControl> CallControl(grpc::CallbackServerContext* context,
                                               const Authenticator* auth, absl::Time start,
                                               absl::Duration max_deadline);

}  // namespace attnserve::transport
