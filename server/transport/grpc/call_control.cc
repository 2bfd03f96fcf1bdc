#include "server/transport/grpc/call_control.h"

#include <algorithm>
#include <chrono>

#include "server/engine/priority.h"
#include "server/transport/grpc/call_auth.h"

namespace attnserve::transport {

absl::StatusOr<engine::JobControl> CallControl(grpc::CallbackServerContext* context,
                                               const Authenticator* auth, absl::Time start,
                                               absl::Duration max_deadline) {
  engine::JobControl control;
  // A client deadline (capped by max_deadline) or cancellation makes the engine drop the job
  // if it has not run yet.
  control.deadline = start + max_deadline;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    control.deadline = std::min(control.deadline, absl::FromChrono(context->deadline()));
  }
  control.cancelled = [context] { return context->IsCancelled(); };
  control.principal = CallPrincipal(auth, *context);
  // Optional x-attnserve-priority metadata (engine/priority.h); a value it does not know is
  // the caller's mistake, named in the answer.
  if (auto it = context->client_metadata().find(engine::kPriorityMetadataKey);
      it != context->client_metadata().end()) {
    absl::StatusOr<engine::Priority> priority =
        engine::ParsePriority(absl::string_view(it->second.data(), it->second.size()));
    if (!priority.ok()) return priority.status();
    control.priority = *priority;
  }
  return control;
}

}  // namespace attnserve::transport
