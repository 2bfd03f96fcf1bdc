#include "server/transport/grpc/answer_reactor.h"

#include <grpcpp/server_context.h>

#include "common/grpc_tsan_handoff.h"

namespace attnserve::transport {

AnswerReactor::AnswerReactor(grpc::CallbackServerContext* context, CallSlots* slots,
                             absl::Duration send_timeout)
    : slots_(slots), send_timeout_(send_timeout), watch_(std::make_shared<Watch>()) {
  watch_->context = context;
}

absl::Status AnswerReactor::AcquireSlot() {
  absl::Status status = slots_->Acquire();
  holds_slot_ = status.ok();
  return status;
}

void AnswerReactor::FinishCall(const grpc::Status& status) {
  // Armed before Finish: once Finish is called, OnDone may delete this at any moment.
  if (send_timeout_ != absl::InfiniteDuration()) {
    watch_->timer.Set(absl::ToChronoTime(absl::Now() + send_timeout_),
                      [weak = std::weak_ptr<Watch>(watch_)](bool fired) {
                        if (!fired) return;
                        std::shared_ptr<Watch> watch = weak.lock();
                        if (watch == nullptr) return;
                        std::lock_guard<std::recursive_mutex> lock(watch->mu);
                        if (watch->context != nullptr) watch->context->TryCancel();
                      });
  }
  // What this call's threads wrote (watch_, holds_slot_) reaches OnDone through gRPC's core,
  // which TSan cannot see (common/grpc_tsan_handoff.h).
  HandOffToGrpc(this);
  Finish(status);
}

void AnswerReactor::OnDone() {
  TakeBackFromGrpc(this);
  {
    std::lock_guard<std::recursive_mutex> lock(watch_->mu);
    watch_->context = nullptr;
  }
  watch_->timer.Cancel();
  if (holds_slot_) slots_->Release();
  delete this;
}

}  // namespace attnserve::transport
