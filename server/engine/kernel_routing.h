// The one routing table: which kernel family runs a request of a given direction, dtype and
// head_dim on a device of a given compute capability, and why. Workers ask it instead of
// hard-coding what each family covers, so adding a family (fallback, Turing flash) is one row.
#pragma once

#include <string>
#include <vector>

#include "kernels/attention_params.h"

namespace attnserve::engine {

enum class Direction { kForward, kBackward };

struct RouteQuery {
  int compute_capability = 0;  // major * 10 + minor; 0 for the CPU
  Direction direction = Direction::kForward;
  kernels::DType dtype = kernels::DType::kFloat32;
  int head_dim = 0;
};

struct Route {
  std::string family;  // "flash" or "reference"
  std::string reason;  // why, for logs and ServerInfo
};

// Families built into this binary; the router never picks one that is not.
struct KernelCatalog {
  bool flash = false;
};

// The first row of the table that covers the query; "reference" (exact, on the CPU) covers
// everything and is last.
Route ChooseRoute(const RouteQuery& query, const KernelCatalog& catalog);

// Whether `family` covers the query (for a forced --kernel choice, and for ServerInfo).
bool Covers(const std::string& family, const RouteQuery& query, const KernelCatalog& catalog);

// Every family the table knows, best first.
std::vector<std::string> KnownFamilies();

}  // namespace attnserve::engine
