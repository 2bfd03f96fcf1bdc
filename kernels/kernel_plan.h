// The kernel-family contract: each family answers Plan(query) -> the code path it would run a
// request on, the shared memory a block of it needs, or why it cannot run it, and lists what it
// covers on a device (Coverage) from the same rules its Plan applies. Routing
// (server/engine/kernel_routing.h) asks the families in its order of preference instead of
// restating them, and the worker pins the planned path in the ExecutionContext, so what was
// planned is what runs. Plain C++ and no CUDA: a build without GPU families plans them too.
// Not included by any kernel (.cu) file, so changing it recompiles no kernel.
#pragma once

#include <climits>
#include <string>
#include <vector>

#include "kernels/attention_params.h"

namespace attnserve::kernels {

enum class Direction { kForward, kBackward };

inline const char* DirectionName(Direction direction) {
  return direction == Direction::kForward ? "forward" : "backward";
}

// What a family needs to know to plan a request on a device.
struct PlanQuery {
  Direction direction = Direction::kForward;
  DType dtype = DType::kFloat32;
  int head_dim = 0;
  // The architecture whose code path runs (major * 10 + minor; 0: the host CPU): the device's
  // own, or an older one it emulates (ExecutionContext::compute_capability).
  int compute_capability = 0;
  // The GPU's own capability; 0: the same as compute_capability. Architecture-specific code
  // (flash's sm_90a kernels) runs only on its own architecture.
  int device_compute_capability = 0;
  int shared_memory_per_block = 0;  // opt-in bytes per block; 0: unknown, not checked
  bool dropout = false;             // options.dropout_p > 0
  bool alibi = false;               // options.alibi_slopes
  bool deterministic = false;       // a backward with bitwise-reproducible dq
  unsigned disabled_paths = 0;      // ExecutionContext::disabled_paths (kPath* bits)
};

// A family's answer for one query. Its workspace is not here: it depends on the request's sizes
// (tokens, heads), which the launch knows and a plan query does not, so the entry's
// *_workspace_bytes(params) give it (kernels/kernel_families.h).
struct KernelPlan {
  bool ok = false;
  // The path within the family: "sm90", "sm80", "sm75", "sm70-wmma", "simt", "gemm", "cpu".
  std::string code_path;
  int shared_memory_bytes = 0;  // per block on that path; 0: sized to the device, or none
  // ok: what the family serves there (ServerInfo's reason). Not ok: why not. When not ok with
  // shared_memory_bytes > 0, the device's shared memory per block is the only obstacle.
  std::string reason;
};

inline constexpr int kAnyComputeCapability = INT_MAX;
inline constexpr int kNoHeadDimBound = INT_MAX;

// One rule of a family: it serves `direction` on compute capabilities [min_cc, max_cc) for the
// dtypes listed and head dims min..max that are multiples of head_dim_multiple, with the
// options flagged. A family's Plan applies its rules; its Coverage lists them for ServerInfo.
struct CoverageRule {
  int min_cc = 0;
  int max_cc = kAnyComputeCapability;
  Direction direction = Direction::kForward;
  std::vector<DType> dtypes;
  int min_head_dim = 1;
  int max_head_dim = kNoHeadDimBound;
  int head_dim_multiple = 1;
  bool dropout = false;
  bool alibi = false;
  const char* reason = "";
};

// A rule over compute capabilities [min_cc, max_cc) and head dims min..max in steps of
// `multiple`; `extras`: it serves dropout and ALiBi.
CoverageRule MakeRule(Direction direction, int min_cc, int max_cc, std::vector<DType> dtypes,
                      int min_head_dim, int max_head_dim, int multiple, bool extras,
                      const char* reason);

// Every dtype the API has.
std::vector<DType> AllDTypes();

// The rule of `rules` that covers the query; nullptr and `why_not` filled when none does.
const CoverageRule* MatchRule(const std::vector<CoverageRule>& rules, const PlanQuery& query,
                              std::string* why_not);

// A plan from the matched rule (ok, with its reason) or from why_not.
KernelPlan PlanFromRule(const CoverageRule* rule, std::string why_not, std::string code_path);

// The plan of a family whose rules are all there is to it: the matching rule's, on `code_path`.
KernelPlan PlanByRules(const std::vector<CoverageRule>& rules, const PlanQuery& query,
                       std::string code_path);

}  // namespace attnserve::kernels
