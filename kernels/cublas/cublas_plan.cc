// The cublas family's plan: cuBLAS GEMMs with the softmax in query chunks, for any dtype and
// head_dim on sm70+; its workspace is bounded and its tiles are cuBLAS's, so shared memory never
// rules it out.
#include "kernels/family_plans.h"

namespace attnserve::kernels::cublas {

std::vector<CoverageRule> Coverage(int compute_capability) {
  constexpr int kMinComputeCapability = 70;
  if (compute_capability < kMinComputeCapability) return {};
  auto rule = [](Direction direction, const char* reason) {
    return MakeRule(direction, kMinComputeCapability, kAnyComputeCapability, AllDTypes(), 1,
                    kNoHeadDimBound, 1, /*extras=*/true, reason);
  };
  return {rule(Direction::kForward,
               "cuBLAS GEMMs with softmax in query chunks (bounded workspace): any dtype and "
               "head_dim; dropout and ALiBi"),
          rule(Direction::kBackward,
               "cuBLAS backward in query chunks: any dtype and head_dim; dropout and ALiBi")};
}

KernelPlan Plan(const PlanQuery& query) {
  return PlanByRules(Coverage(query.compute_capability), query, "gemm");
}

}  // namespace attnserve::kernels::cublas
