// How a request too long for one GPU launch is cut into several (--max_launch_seconds). A
// launch, once enqueued, runs to its end: nothing in our kernels polls a stop flag, and the
// device cannot preempt it. So a request whose estimated device time (work_estimate.h) exceeds
// the slice runs as launches of at most about one slice each, and the lane checks between
// them whether its deadline passed or its caller left (cuda_lane.h LaneStep::before_launch):
// a stopped request then holds the device at most about one slice past the moment it stopped.
// Requests whose tensors lie in the device's memory (cuda_resident.h) are cut the same way, at
// offsets into those tensors. The CPU device cuts a backward the same way too (split_backward.h;
// its reference kernels also stop part way on their own), so both devices sum a long
// sequence's dk and dv by the same blocks.
//
// The cuts: groups of whole sequences (sequences are independent, so each group's answer is
// bitwise the one launch's), and a sequence that alone exceeds the slice, forward or backward,
// by blocks of its query rows. Rows [a, b) of a sequence of sq queries and sk keys are the
// sequence of b − a queries over its keys [0, key_end): FlashAttention's mask is aligned
// bottom-right (row i sees keys up to i + sk − sq + window_right), so keeping the block's
// key count at b + sk − sq keeps every row's diagonal where it was. Where window_right > 0
// lets the block's last rows see past that, key_end grows by that much (d, at most sk) and
// the window moves the other way (window_right − d, window_left + d), which again leaves each
// row's visible keys unchanged. Blocks start at multiples of kRowBlockAlignment rows, so
// their query tiles are the whole launch's and each row meets its keys in the same tiles.
//
// A backward block computes dq of its rows completely (each row's dq sums over its own keys
// only) and its lse is its rows' columns. dk and dv of a key sum over every query row, so a
// block gives a partial sum over its rows for keys [0, key_end) (keys past key_end get nothing
// from it): the engine adds each block's partial dk and dv into float32 accumulators beside the
// outputs, sized to that one sequence's keys, and writes the final dk and dv in the output
// dtype after the sequence's last block (split_backward.h on the host, cuda_grouped_backward.h
// on a GPU). The blocks run in the plan's order, first rows first, so the sum's order is fixed
// and a deterministic backward stays bitwise reproducible; it is not bitwise the unsplit
// launch's (that one sums dk and dv over row tiles in its own order), only equal within float
// rounding, each partial having been rounded to the output dtype once.
//
// With dropout or ALiBi a request is cut by whole sequences only: a row block renumbers its
// rows, which key the dropout mask, and moves its diagonal, which ALiBi's distances start from.
#pragma once

#include <cstdint>
#include <vector>

#include "server/engine/attention_request.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/work_estimate.h"

namespace attnserve::engine {

// A multiple of every query tile our GPU kernels use (64, 128, 192 and 256 rows).
inline constexpr int64_t kRowBlockAlignment = 768;

struct LaunchRange {
  int32_t first_sequence = 0, end_sequence = 0;  // the sequences it covers, [first, end)
  // A block of one sequence's query rows (end_sequence = first_sequence + 1): rows
  // [row_begin, row_end) of it over its keys [0, key_end), the window moved by window_shift.
  bool row_block = false;
  int64_t row_begin = 0, row_end = 0, key_end = 0;
  int window_shift = 0;
};

struct SplitRequest {
  Direction direction = Direction::kForward;
  const std::vector<int32_t>* cu_seqlens_q = nullptr;
  const std::vector<int32_t>* cu_seqlens_k = nullptr;
  RequestOptions options;
  int64_t heads = 0;  // query heads
  int head_dim = 0;
  // Bytes that cross the host link per query row and per key row, every tensor counted.
  double query_row_bytes = 0, key_row_bytes = 0;
  Throughput rate;  // of the family and device that run it
};

// The request's shape as the planner sees it: `q` (its rows and heads), the offsets (kept by
// pointer: they must outlive the request), the options and the rate; no bytes over the host
// link (set query_row_bytes / key_row_bytes where they cross it).
SplitRequest SplitRequestOf(Direction direction, const TensorView& q,
                            const std::vector<int32_t>& cu_seqlens_q,
                            const std::vector<int32_t>& cu_seqlens_k,
                            const RequestOptions& options, const Throughput& rate);

// The launches, in order, covering every sequence once; empty when the request fits one
// slice (it then runs as one launch, as it always did) or slice_seconds is 0 (off).
std::vector<LaunchRange> PlanLaunchSplit(const SplitRequest& request, double slice_seconds);
// The same over sequences [first, end) alone (a group that arrives together).
std::vector<LaunchRange> PlanLaunchSplit(const SplitRequest& request, double slice_seconds,
                                         int32_t first, int32_t end);

// The window a row block's launch runs with (options resolved for the kernels).
void ShiftWindow(int window_shift, int* window_left, int* window_right);

}  // namespace attnserve::engine
