#include "server/engine/sequence_groups.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnserve::engine {
namespace {

// How often a waiting worker looks at the caller's cancellation (which does not signal).
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

SequenceGroups::SequenceGroups(std::vector<int32_t> ends, absl::Time deadline,
                               std::function<bool()> cancelled,
                               std::function<void(int)> finished)
    : ends_(std::move(ends)),
      deadline_(deadline),
      cancelled_(std::move(cancelled)),
      finished_(std::move(finished)),
      arrived_(ends_.size(), false) {}

void SequenceGroups::MarkArrived(int group) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrived_[group] = true;
  }
  cv_.notify_all();
}

absl::Status SequenceGroups::WaitFor(int group) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!arrived_[group]) {
    const absl::Time now = absl::Now();
    if (now >= deadline_) {
      return absl::DeadlineExceededError(absl::StrCat(
          "deadline passed while sequences ", first_sequence(group), "..",
          end_sequence(group) - 1, " of the request were still arriving"));
    }
    if (cancelled_ && cancelled_()) {
      return absl::CancelledError("the caller cancelled the request while it was arriving");
    }
    cv_.wait_until(lock, absl::ToChronoTime(std::min(deadline_, now + kCancelPoll)));
  }
  return absl::OkStatus();
}

absl::Status SequenceGroups::WaitForAll() {
  for (int g = 0; g < count(); ++g) {
    if (absl::Status s = WaitFor(g); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace attnserve::engine
