// A request whose inputs arrive group by group (a group: consecutive whole sequences), so a
// worker can compute group g while later groups still arrive, and whose transport wants each
// group's outputs as soon as they are written. The transport marks groups arrived; the worker
// waits for each before it reads its rows, and reports each group it finished. Sequences are
// independent, so a group's outputs (its query rows of out, its columns of lse) depend on its
// own rows of q, k and v only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace attnserve::engine {

class SequenceGroups {
 public:
  // `ends`: each group's end sequence index, increasing, the last one the batch size.
  // `finished(g)` (may be empty) runs once group g's outputs are at their destinations, in
  // group order: on the CPU worker's thread, or on a CUDA host-function thread for a GPU lane
  // (so it must neither block nor call CUDA). `cancelled` (may be empty) and `deadline` end a
  // wait early.
  SequenceGroups(std::vector<int32_t> ends, absl::Time deadline,
                 std::function<bool()> cancelled, std::function<void(int)> finished);

  int count() const { return static_cast<int>(ends_.size()); }
  int32_t first_sequence(int group) const { return group == 0 ? 0 : ends_[group - 1]; }
  int32_t end_sequence(int group) const { return ends_[group]; }

  // Transport side: every byte of `group`'s rows is in.
  void MarkArrived(int group);
  // Worker side: OK once `group` has arrived; DEADLINE_EXCEEDED or CANCELLED when the call
  // ends first (a cancellation is noticed within a polling interval).
  absl::Status WaitFor(int group);
  absl::Status WaitForAll();
  void Finished(int group) const {
    if (finished_) finished_(group);
  }

 private:
  const std::vector<int32_t> ends_;
  const absl::Time deadline_;
  const std::function<bool()> cancelled_;
  const std::function<void(int)> finished_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> arrived_;
};

}  // namespace attnserve::engine
