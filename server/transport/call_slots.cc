#include "server/transport/call_slots.h"

#include "absl/strings/str_cat.h"

namespace attnserve::transport {

absl::Status CallSlots::Acquire() {
  const int64_t before = active_.fetch_add(1, std::memory_order_relaxed);
  if (max_ > 0 && before >= max_) {
    active_.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("the server is already serving max_concurrent_requests = ", max_,
                     " requests; retry later"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::transport
