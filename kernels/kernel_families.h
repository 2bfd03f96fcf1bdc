// Every kernel family, by name, behind one entry-point table: the engine and the C ABI
// (kernels/capi) look families up here instead of including each family's header. Each entry
// carries the family's plan (kernels/kernel_plan.h), known whether or not its kernels are built,
// and its entry points where they are.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/kernel_plan.h"

namespace attnserve::kernels {

struct KernelFamilyEntry {
  const char* name;       // "reference", "flash", "fallback", "cublas"
  bool runs_on_device;    // tensors in device memory on ctx.stream (else host memory)
  ForwardFn forward;      // nullptr: the family is not built into this binary
  BackwardFn backward;
  // Bytes of ctx.workspace each direction needs (16-byte aligned); 0 = none. The backward's
  // may depend on the code path that runs (the plan's code_path, which the engine pins into the
  // context, kernel_plan.h); an empty code_path gives what any of the family's paths needs.
  size_t (*forward_workspace_bytes)(const ForwardParams&);
  size_t (*backward_workspace_bytes)(const BackwardParams&, std::string_view code_path);
  // The code path it would run a request on, with its shared memory, or why not.
  KernelPlan (*plan)(const PlanQuery&);
  // Its rules on a device of this compute capability (0: the host CPU), best first.
  std::vector<CoverageRule> (*coverage)(int compute_capability);
  // Makes the family run exactly `plan`'s code path under `ctx` (nullptr: the query decides).
  void (*pin)(const KernelPlan& plan, ExecutionContext* ctx);

  bool built() const { return forward != nullptr; }
};

// Every family this source tree knows, built or not: routing plans over them, so a build
// without CUDA still says what each would do.
const std::vector<KernelFamilyEntry>& KnownKernelFamilies();

// The families compiled in, best first by nothing in particular (routing decides; see
// server/engine/kernel_routing.h). "reference" is always there.
const std::vector<KernelFamilyEntry>& BuiltKernelFamilies();

// nullptr when no family of that name is built.
const KernelFamilyEntry* FindKernelFamily(std::string_view name);

// nullptr when no family of that name is known.
const KernelFamilyEntry* FindKnownKernelFamily(std::string_view name);

// `family`'s plan pinned into `ctx` (a no-op for families whose query decides the path).
void PinPlan(const KernelFamilyEntry& family, const KernelPlan& plan, ExecutionContext* ctx);

}  // namespace attnserve::kernels
