// The max_concurrent_requests budget, shared by every transport that runs Forward/Backward
// calls (the gRPC service and the bulk data path), so the limit holds over all of them.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace attnserve::transport {

class CallSlots {
 public:
  // `max_concurrent_requests` 0 = unlimited.
  explicit CallSlots(int64_t max_concurrent_requests) : max_(max_concurrent_requests) {}
  CallSlots(const CallSlots&) = delete;
  CallSlots& operator=(const CallSlots&) = delete;

  // Takes one slot; RESOURCE_EXHAUSTED (and nothing taken) when all are in use.
  absl::Status Acquire();
  void Release() { active_.fetch_sub(1, std::memory_order_relaxed); }

  int64_t active() const { return active_.load(std::memory_order_relaxed); }

 private:
  const int64_t max_;
  std::atomic<int64_t> active_{0};
};

}  // namespace attnserve::transport
