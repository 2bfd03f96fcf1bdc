// The reference family's plan: exact CPU kernels serve every request on every device.
#include "kernels/family_plans.h"

namespace attnserve::kernels::reference {

std::vector<CoverageRule> Coverage(int /*compute_capability*/) {
  constexpr const char* kReason =
      "exact CPU kernels: every dtype, head_dim and device; dropout and ALiBi";
  std::vector<CoverageRule> rules;
  for (Direction direction : {Direction::kForward, Direction::kBackward}) {
    rules.push_back(MakeRule(direction, 0, kAnyComputeCapability, AllDTypes(), 1,
                             kNoHeadDimBound, 1, /*extras=*/true, kReason));
  }
  return rules;
}

KernelPlan Plan(const PlanQuery& query) {
  return PlanByRules(Coverage(query.compute_capability), query, "cpu");
}

}  // namespace attnserve::kernels::reference
