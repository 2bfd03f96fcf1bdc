// Routing policy: which kernel family runs a request of a given direction, dtype and head_dim on
// a device of a given compute capability, and why. It holds only the order of preference
// among families; what each family serves, on which code path, comes from the family's own plan
// (kernels/kernel_plan.h), so adding a family is one entry there and one name here. Placement
// routes a request once; the route travels with the job and the worker runs it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/kernel_plan.h"

namespace attnserve::engine {

using kernels::Direction;
using kernels::DirectionName;  // "forward" / "backward"

struct RouteQuery {
  int compute_capability = 0;  // major * 10 + minor, as routed (possibly emulated); 0: the CPU
  Direction direction = Direction::kForward;
  kernels::DType dtype = kernels::DType::kFloat32;
  int head_dim = 0;
  // The device's opt-in shared memory per block in bytes; 0: unknown, not checked. A family
  // whose kernel for the query needs more is passed over (flash at large head dims on
  // sm86/89, whose blocks get 99 KB).
  int shared_memory_per_block = 0;
  // Options only some families implement: options.dropout_p > 0, options.alibi_slopes.
  bool dropout = false;
  bool alibi = false;
  bool deterministic = false;         // a backward's: some code paths are atomic-only
  int device_compute_capability = 0;  // the GPU's own when emulating; 0: compute_capability
};

struct Route {
  std::string family;     // empty when no family in the catalog covers the query
  std::string code_path;  // the family's path: "sm90", "sm80", "cpu", ... (kernels/kernel_plan.h)
  std::string reason;     // why, for logs, errors and ServerInfo
  int shared_memory_bytes = 0;  // per block on that path (0: sized to the device, or none)

  // Whether a router has decided it (a job submitted straight to a worker, in tests, has not).
  bool decided() const { return !family.empty() || !reason.empty(); }
  // "flash/sm90": what Execution.code_path and the metrics report.
  std::string Name() const { return code_path.empty() ? family : family + "/" + code_path; }
  bool operator==(const Route& other) const {
    return family == other.family && code_path == other.code_path;
  }
};

// The families the router may pick: those built into this binary, or only the one a
// --kernel=<family> flag forces (tests).
struct KernelCatalog {
  std::vector<std::string> families;

  bool Has(std::string_view family) const;
  static KernelCatalog Built();  // kernels/kernel_families.h
  static KernelCatalog Only(std::string family);
};

// One family's rule as it applies to a device: `family` serves `direction` for `dtypes` and
// head dims min..max that are multiples of head_dim_multiple.
struct CoverageRow {
  std::string family;
  Direction direction = Direction::kForward;
  std::vector<kernels::DType> dtypes;
  int min_head_dim = 1;
  int max_head_dim = 0;  // INT_MAX: no bound of the family's own
  int head_dim_multiple = 1;
  bool dropout = false;  // serves options.dropout_p > 0
  bool alibi = false;    // serves options.alibi_slopes
  std::string reason;
};

// The families in order of preference; the first in the catalog whose plan runs the query wins.
const std::vector<std::string>& RoutingPreference();

// The query as the family plans see it.
kernels::PlanQuery PlanQueryOf(const RouteQuery& query);

// The first family of the preference order that is in the catalog and plans the query.
Route ChooseRoute(const RouteQuery& query, const KernelCatalog& catalog);

// The families' rules that apply on a device of this compute capability and shared memory per
// block (0: unknown), best first, each rule's head-dim range cut to what its family's plan fits
// on the device (ServerInfo lists them per device).
std::vector<CoverageRow> CoverageFor(int compute_capability, int shared_memory_per_block,
                                     const KernelCatalog& catalog);

}  // namespace attnserve::engine
