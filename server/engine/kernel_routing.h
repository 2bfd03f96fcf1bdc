// The one routing table: which kernel family runs a request of a given direction, dtype and
// head_dim on a device of a given compute capability, and why. Workers, placement and
// ServerInfo ask it instead of hard-coding what each family covers, so adding a family is one
// row.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention_params.h"

namespace attnserve::engine {

enum class Direction { kForward, kBackward };

const char* DirectionName(Direction direction);  // "forward" / "backward"

struct RouteQuery {
  int compute_capability = 0;  // major * 10 + minor; 0 for the CPU
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
};

struct Route {
  std::string family;  // empty when no family in the catalog covers the query
  std::string reason;  // why, for logs, errors and ServerInfo
};

// The families the router may pick: those built into this binary, or only the one a
// --kernel=<family> flag forces (tests).
struct KernelCatalog {
  std::vector<std::string> families;

  bool Has(std::string_view family) const;
  static KernelCatalog Built();  // kernels/kernel_families.h
  static KernelCatalog Only(std::string family);
};

// One row of the table as it applies to a device: `family` serves `direction` for `dtypes` and
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

// The first row of the table that covers the query and whose family is in the catalog.
Route ChooseRoute(const RouteQuery& query, const KernelCatalog& catalog);

// The rows that apply on a device of this compute capability and shared memory per block
// (0: unknown), best first, each row's head-dim range cut to what fits (ServerInfo lists them
// per device).
std::vector<CoverageRow> CoverageFor(int compute_capability, int shared_memory_per_block,
                                     const KernelCatalog& catalog);

}  // namespace attnserve::engine
