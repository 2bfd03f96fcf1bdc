// When the flash family runs its Hopper (sm_90a, wgmma) kernels instead of its sm80 ones: one
// rule that its plan (flash/flash_plan.cc, which routing asks) and its dispatcher
// (flash/flash_attention.cc, which launches) both apply, so the planned path is the one that
// runs. Lives outside kernels/flash/ because every flash kernel object depends on the headers
// there.
#pragma once

#include "kernels/attention_params.h"
#include "kernels/flash/arch.h"

namespace attnserve::kernels::flash {

struct Sm90Candidate {
  bool backward = false;
  int compute_capability = 0;         // the path's (effective) capability
  int device_compute_capability = 0;  // the GPU's own
  bool kernel_built = false;  // an sm90 kernel of the instantiated head dim is in this build
  int kernel_shared_memory = 0;  // bytes per block it needs
  int shared_memory_limit = 0;   // bytes per block the device gives; 0: unknown, not checked
  bool extras = false;           // dropout or ALiBi: the sm80 kernels only
  unsigned disabled_paths = 0;   // ExecutionContext::disabled_paths
};

// sm_90a code runs on compute capability 9.x devices only (arch-specific features are not
// forward compatible), so newer GPUs keep the sm80 kernels.
inline bool RunsSm90(const Sm90Candidate& c) {
  const unsigned bit = c.backward ? kPathSm90Backward : kPathSm90Forward;
  return c.kernel_built && c.compute_capability >= Sm90::kComputeCapability &&
         c.device_compute_capability / 10 == Sm90::kComputeCapability / 10 &&
         (c.shared_memory_limit <= 0 || c.kernel_shared_memory <= c.shared_memory_limit) &&
         !c.extras && (c.disabled_paths & bit) == 0;
}

}  // namespace attnserve::kernels::flash
