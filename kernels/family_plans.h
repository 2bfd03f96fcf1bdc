// Each kernel family's plan (kernels/kernel_plan.h): its rules on a device of a compute
// capability (Coverage), the path it would run a request on or why not (Plan), and for GPU
// families how a planned path is pinned in an ExecutionContext (Pin). Plain C++, built whether or
// not the family's kernels are (a build without CUDA still answers what each family would do),
// and kept out of the kernel files' headers so a change here recompiles no kernel.
#pragma once

#include <vector>

#include "kernels/kernel_plan.h"

namespace attnserve::kernels {

namespace reference {
KernelPlan Plan(const PlanQuery& query);
std::vector<CoverageRule> Coverage(int compute_capability);
}  // namespace reference

namespace flash {
KernelPlan Plan(const PlanQuery& query);
std::vector<CoverageRule> Coverage(int compute_capability);
// "sm80" switches the Hopper kernels off (disabled_paths), "sm75" selects the Turing kernels
// (compute_capability); "sm90" is what the dispatcher picks where it is planned.
void Pin(const KernelPlan& plan, ExecutionContext* ctx);
}  // namespace flash

namespace fallback {
KernelPlan Plan(const PlanQuery& query);
std::vector<CoverageRule> Coverage(int compute_capability);
}  // namespace fallback

namespace cublas {
KernelPlan Plan(const PlanQuery& query);
std::vector<CoverageRule> Coverage(int compute_capability);
}  // namespace cublas

}  // namespace attnserve::kernels
