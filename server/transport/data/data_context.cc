#include "server/transport/data/data_context.h"

namespace attnserve::transport::data {

bool BufferBudget::TryReserve(int64_t bytes) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (used + bytes > max_) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  metrics_->AddBufferedBytes(static_cast<double>(bytes));
  return true;
}

void BufferBudget::Release(int64_t bytes) {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  metrics_->AddBufferedBytes(-static_cast<double>(bytes));
}

absl::StatusOr<std::unique_ptr<SlotLease>> SlotLease::Acquire(DataContext* context) {
  if (absl::Status slot = context->slots->Acquire(); !slot.ok()) return slot;
  {
    std::lock_guard<std::mutex> lock(context->calls_mu);
    ++context->calls;
  }
  return std::unique_ptr<SlotLease>(new SlotLease(context));
}

SlotLease::~SlotLease() {
  context_->slots->Release();
  std::lock_guard<std::mutex> lock(context_->calls_mu);
  if (--context_->calls == 0) context_->calls_cv.notify_all();
}

}  // namespace attnserve::transport::data
