#include "server/engine/group_launch.h"

#include "server/engine/kernel_runner.h"

namespace attnserve::engine {

GroupLaunches PlanGroupLaunches(const SequenceGroups& groups, const TensorView& q,
                                const TensorView& k, const std::vector<int32_t>& cu_seqlens_q,
                                const std::vector<int32_t>& cu_seqlens_k) {
  std::vector<LaunchRange> ranges(groups.count());
  for (int g = 0; g < groups.count(); ++g) {
    ranges[g].first_sequence = groups.first_sequence(g);
    ranges[g].end_sequence = groups.end_sequence(g);
  }
  return PlanSplitLaunches(ranges, q, k, cu_seqlens_q, cu_seqlens_k);
}

GroupPieces CutGroups(const SequenceGroups& groups,
                      const std::function<std::vector<LaunchRange>(int32_t, int32_t)>& cut) {
  GroupPieces pieces;
  for (int g = 0; g < groups.count(); ++g) {
    std::vector<LaunchRange> ranges =
        cut ? cut(groups.first_sequence(g), groups.end_sequence(g)) : std::vector<LaunchRange>{};
    if (ranges.empty()) {
      LaunchRange whole;
      whole.first_sequence = groups.first_sequence(g);
      whole.end_sequence = groups.end_sequence(g);
      ranges.push_back(whole);
    }
    pieces.ranges.insert(pieces.ranges.end(), ranges.begin(), ranges.end());
    pieces.group_of.insert(pieces.group_of.end(), ranges.size(), g);
  }
  return pieces;
}

GroupLaunches PlanSplitLaunches(const std::vector<LaunchRange>& ranges, const TensorView& q,
                                const TensorView& k, const std::vector<int32_t>& cu_seqlens_q,
                                const std::vector<int32_t>& cu_seqlens_k) {
  GroupLaunches plan;
  plan.groups.resize(ranges.size());
  std::vector<std::vector<int32_t>> rebased_q(ranges.size()), rebased_k(ranges.size());
  for (size_t g = 0; g < ranges.size(); ++g) {
    GroupLaunch& launch = plan.groups[g];
    const LaunchRange& range = ranges[g];
    const int32_t b0 = range.first_sequence, b1 = range.end_sequence;
    launch.first_sequence = b0;
    if (range.row_block) {
      // One sequence's rows [row_begin, row_end) over its keys [0, key_end).
      launch.q0 = cu_seqlens_q[b0] + range.row_begin;
      launch.q1 = cu_seqlens_q[b0] + range.row_end;
      launch.k0 = cu_seqlens_k[b0];
      launch.k1 = cu_seqlens_k[b0] + range.key_end;
      launch.window_shift = range.window_shift;
      launch.row_block = true;
      launch.first_block = range.row_begin == 0;
      launch.last_block = range.row_end == cu_seqlens_q[b0 + 1] - cu_seqlens_q[b0];
      launch.seq_k1 = cu_seqlens_k[b0 + 1];
      rebased_q[g] = {0, static_cast<int32_t>(launch.q1 - launch.q0)};
      rebased_k[g] = {0, static_cast<int32_t>(launch.k1 - launch.k0)};
    } else {
      launch.q0 = cu_seqlens_q[b0];
      launch.q1 = cu_seqlens_q[b1];
      launch.k0 = cu_seqlens_k[b0];
      launch.k1 = cu_seqlens_k[b1];
      rebased_q[g] = Rebased(cu_seqlens_q, b0, b1);
      rebased_k[g] = Rebased(cu_seqlens_k, b0, b1);
    }
    launch.cu_q_at = plan.offsets.size();
    plan.offsets.insert(plan.offsets.end(), rebased_q[g].begin(), rebased_q[g].end());
    launch.cu_k_at = plan.offsets.size();
    plan.offsets.insert(plan.offsets.end(), rebased_k[g].begin(), rebased_k[g].end());
  }
  // The offsets are complete: the shapes may point into them now.
  for (size_t g = 0; g < ranges.size(); ++g) {
    GroupLaunch& launch = plan.groups[g];
    launch.shape = ShapeOf(RowsOfView(q, launch.q0, launch.q1),
                           RowsOfView(k, launch.k0, launch.k1), rebased_q[g], rebased_k[g]);
    launch.shape.cu_seqlens_q = plan.offsets.data() + launch.cu_q_at;
    launch.shape.cu_seqlens_k = plan.offsets.data() + launch.cu_k_at;
  }
  return plan;
}

kernels::AttentionOptions LaunchOptions(const kernels::AttentionOptions& request,
                                        const GroupLaunch& launch) {
  kernels::AttentionOptions options = request;
  ShiftWindow(launch.window_shift, &options.window_left, &options.window_right);
  options.first_sequence = request.first_sequence + launch.first_sequence;
  return options;
}

}  // namespace attnserve::engine
