#include "server/engine/group_launch.h"

#include "server/engine/kernel_runner.h"

namespace attnserve::engine {

GroupLaunches PlanGroupLaunches(const SequenceGroups& groups, const TensorView& q,
                                const TensorView& k, const std::vector<int32_t>& cu_seqlens_q,
                                const std::vector<int32_t>& cu_seqlens_k) {
  GroupLaunches plan;
  plan.groups.resize(groups.count());
  std::vector<std::vector<int32_t>> rebased_q(groups.count()), rebased_k(groups.count());
  for (int g = 0; g < groups.count(); ++g) {
    GroupLaunch& launch = plan.groups[g];
    const int32_t b0 = groups.first_sequence(g), b1 = groups.end_sequence(g);
    launch.first_sequence = b0;
    launch.q0 = cu_seqlens_q[b0];
    launch.q1 = cu_seqlens_q[b1];
    launch.k0 = cu_seqlens_k[b0];
    launch.k1 = cu_seqlens_k[b1];
    rebased_q[g] = Rebased(cu_seqlens_q, b0, b1);
    rebased_k[g] = Rebased(cu_seqlens_k, b0, b1);
    launch.cu_q_at = plan.offsets.size();
    plan.offsets.insert(plan.offsets.end(), rebased_q[g].begin(), rebased_q[g].end());
    launch.cu_k_at = plan.offsets.size();
    plan.offsets.insert(plan.offsets.end(), rebased_k[g].begin(), rebased_k[g].end());
  }
  // The offsets are complete: the shapes may point into them now.
  for (int g = 0; g < groups.count(); ++g) {
    GroupLaunch& launch = plan.groups[g];
    launch.shape = ShapeOf(RowsOfView(q, launch.q0, launch.q1),
                           RowsOfView(k, launch.k0, launch.k1), rebased_q[g], rebased_k[g]);
    launch.shape.cu_seqlens_q = plan.offsets.data() + launch.cu_q_at;
    launch.shape.cu_seqlens_k = plan.offsets.data() + launch.cu_k_at;
  }
  return plan;
}

}  // namespace attnserve::engine
