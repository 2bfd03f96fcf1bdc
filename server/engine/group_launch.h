// How a request runs as several launches: one per group of sequences that arrives together
// (sequence_groups.h), or per piece of a request too long for one launch (launch_split.h).
// Each is its own varlen launch over its rows, with its sequences' offsets rebased to its
// first one. Every launch's offsets lie back to back in one small array, so on a GPU they
// cross to the device once.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/attention_params.h"
#include "server/engine/attention_request.h"
#include "server/engine/launch_split.h"
#include "server/engine/sequence_groups.h"

namespace attnserve::engine {

struct GroupLaunch {
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;  // the group's query and key rows
  size_t cu_q_at = 0, cu_k_at = 0;          // its offsets in GroupLaunches::offsets, in int32s
  int window_shift = 0;  // a block of one sequence's rows: LaunchRange::window_shift
  // A block of one sequence's rows (LaunchRange::row_block): k0 is the sequence's first key,
  // seq_k1 its end, and first_block / last_block say whether the block is its first or last
  // (where a backward's float32 sums of partial dk and dv start and are written out).
  bool row_block = false, first_block = false, last_block = false;
  int64_t seq_k1 = 0;
  // The request's index of the launch's first sequence: the launch sets
  // AttentionOptions::first_sequence to it (the dropout mask and per-sequence ALiBi slopes).
  int first_sequence = 0;
  // The launch's shape; cu_seqlens_* point into GroupLaunches::offsets (the device copies are
  // the launch's to fill in).
  kernels::AttentionShape shape;
};

struct GroupLaunches {
  std::vector<GroupLaunch> groups;
  std::vector<int32_t> offsets;

  size_t offsets_bytes() const { return offsets.size() * sizeof(int32_t); }
};

// `q` and `k` give dtype, heads and head_dim; the offsets are the whole request's. The result
// must not be copied once made (its shapes point into its own offsets): move it.
GroupLaunches PlanGroupLaunches(const SequenceGroups& groups, const TensorView& q,
                                const TensorView& k, const std::vector<int32_t>& cu_seqlens_q,
                                const std::vector<int32_t>& cu_seqlens_k);
// A request arriving group by group, each group cut where it alone exceeds a launch's slice:
// the launches in order, and the arrival group each belongs to. `cut(first, end)` gives the
// pieces of sequences [first, end) (PlanLaunchSplit), empty when they are one launch.
struct GroupPieces {
  std::vector<LaunchRange> ranges;
  std::vector<int> group_of;
};
GroupPieces CutGroups(const SequenceGroups& groups,
                      const std::function<std::vector<LaunchRange>(int32_t, int32_t)>& cut);

// The same for the pieces PlanLaunchSplit (or CutGroups) chose.
GroupLaunches PlanSplitLaunches(const std::vector<LaunchRange>& ranges, const TensorView& q,
                                const TensorView& k, const std::vector<int32_t>& cu_seqlens_q,
                                const std::vector<int32_t>& cu_seqlens_k);

// A launch's options: the request's, with a row block's window moved (launch_split.h).
kernels::AttentionOptions LaunchOptions(const kernels::AttentionOptions& request,
                                        const GroupLaunch& launch);

// A scratch segment's size rounded up so the next segment of a workspace starts aligned as
// kernels need (256 bytes, as cudaMalloc's).
inline size_t AlignedScratch(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes of one row of a packed [rows, heads, head_dim] tensor.
inline size_t RowBytesOf(const TensorView& t) {
  return static_cast<size_t>(t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype));
}

}  // namespace attnserve::engine
