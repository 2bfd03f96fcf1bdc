// The reactor of a Forward or Backward call. It holds the call's max_concurrent_requests slot
// until gRPC has written the answer out (OnDone), not merely until the answer is handed over
// (Finish): a client that never reads its answers used to free its slot at once while gRPC
// kept each answer (up to a message) in memory, so 32 such calls held 2.6 GB. An answer not
// taken within the send timeout cancels the call, which frees its memory and its slot.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/support/server_callback.h>

#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/transport/call_slots.h"

namespace grpc {
class CallbackServerContext;
}

namespace attnserve::transport {

class AnswerReactor final : public grpc::ServerUnaryReactor {
 public:
  // Deletes itself when the call is done. `slots` must outlive it.
  AnswerReactor(grpc::CallbackServerContext* context, CallSlots* slots,
                absl::Duration send_timeout);

  // Takes a slot, given back when the call is done; RESOURCE_EXHAUSTED if none is free.
  absl::Status AcquireSlot();
  // Finishes the call and starts the send timeout.
  void FinishCall(const grpc::Status& status);

  void OnDone() override;

 private:
  // Shared with the send timer's callback, which may run after the reactor is gone. The mutex
  // is recursive because cancelling may run OnDone on the same thread, inline.
  struct Watch {
    std::recursive_mutex mu;
    grpc::CallbackServerContext* context = nullptr;  // null once the call is done
    grpc::Alarm timer;
  };

  CallSlots* const slots_;
  const absl::Duration send_timeout_;
  bool holds_slot_ = false;
  std::shared_ptr<Watch> watch_;
};

}  // namespace attnserve::transport
