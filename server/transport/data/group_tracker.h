// Which groups of a call's sequences have all their bytes in, so the engine can start a group
// while later ones still arrive (spec: "Details the server implements", Groups). A group is
// consecutive whole sequences; its bytes are payload ranges (common/data_channel_wire.h's
// GroupRanges: its rows of q, k and v for a forward; of dout, q, k, v and out, and with the
// first group all of lse, for a backward), complete when every chunk that overlaps them has
// arrived (a chunk may straddle two groups). Not thread-safe: the session's lock guards it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/data_channel_wire.h"
#include "server/transport/data/request_plan.h"

namespace attnserve::transport::data {

// Each group's end sequence index (common/data_channel_wire.h's split, which clients share);
// empty when the call is not grouped: a small payload, one sequence, or a backward on a saved
// context whose request leaves out cu_seqlens (or sends ones that do not fit dout: the engine
// refuses those).
std::vector<int32_t> GroupEnds(const PlannedCall& call);

class GroupTracker {
 public:
  // `ends`: GroupEnds(call), not empty.
  GroupTracker(const PlannedCall& call, std::vector<int32_t> ends);

  const std::vector<int32_t>& ends() const { return ends_; }
  // Groups with no bytes at all (only empty sequences): complete from the start.
  std::vector<int> Empty() const;
  // The chunk at `offset` has arrived; returns the groups it completed.
  std::vector<int> Arrived(uint64_t offset);

 private:
  const std::vector<int32_t> ends_;
  const int64_t chunk_bytes_;
  std::vector<int64_t> missing_;               // per group: chunks not yet arrived
  std::vector<std::vector<int>> chunk_groups_;  // per chunk: the groups it overlaps
};

}  // namespace attnserve::transport::data
