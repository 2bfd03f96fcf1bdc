#include "server/engine/kernel_routing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/kernel_families.h"

namespace attnserve::engine {
namespace {

using kernels::DType;
using kernels::KernelFamilyEntry;
using kernels::KernelPlan;

// The largest head dim h of the rule such that its family plans every head dim of the rule up
// to h on the device; below min_head_dim when it plans none. Only families whose plan depends on
// the device's shared memory can cut a rule, so without a limit or a bound nothing is probed.
int LargestPlannedHeadDim(const KernelFamilyEntry& family, const kernels::CoverageRule& rule,
                          int compute_capability, int shared_memory_per_block) {
  if (shared_memory_per_block <= 0 || rule.max_head_dim == kernels::kNoHeadDimBound ||
      rule.dtypes.empty()) {
    return rule.max_head_dim;
  }
  kernels::PlanQuery query;
  query.direction = rule.direction;
  query.dtype = rule.dtypes.front();
  query.compute_capability = compute_capability;
  query.shared_memory_per_block = shared_memory_per_block;
  int largest = rule.min_head_dim - 1;
  for (int d = rule.min_head_dim; d <= rule.max_head_dim; d += rule.head_dim_multiple) {
    query.head_dim = d;
    if (!family.plan(query).ok) break;
    largest = d;
  }
  return largest;
}

}  // namespace

bool KernelCatalog::Has(std::string_view family) const {
  return std::find(families.begin(), families.end(), family) != families.end();
}

KernelCatalog KernelCatalog::Built() {
  KernelCatalog catalog;
  for (const KernelFamilyEntry& entry : kernels::BuiltKernelFamilies()) {
    catalog.families.push_back(entry.name);
  }
  return catalog;
}

KernelCatalog KernelCatalog::Only(std::string family) {
  return KernelCatalog{{std::move(family)}};
}

// Our own kernels first (flash, then the fallback that runs what flash cannot), cuBLAS for what
// neither has a kernel for, the exact CPU reference last.
const std::vector<std::string>& RoutingPreference() {
  static const std::vector<std::string> order = {"flash", "fallback", "cublas", "reference"};
  return order;
}

kernels::PlanQuery PlanQueryOf(const RouteQuery& query) {
  kernels::PlanQuery plan;
  plan.direction = query.direction;
  plan.dtype = query.dtype;
  plan.head_dim = query.head_dim;
  plan.compute_capability = query.compute_capability;
  plan.device_compute_capability = query.device_compute_capability;
  plan.shared_memory_per_block = query.shared_memory_per_block;
  plan.dropout = query.dropout;
  plan.alibi = query.alibi;
  plan.deterministic = query.deterministic;
  return plan;
}

Route ChooseRoute(const RouteQuery& query, const KernelCatalog& catalog) {
  const kernels::PlanQuery plan_query = PlanQueryOf(query);
  std::string too_big;  // why a family that would cover the query does not fit the device
  for (const std::string& name : RoutingPreference()) {
    const KernelFamilyEntry* family = kernels::FindKnownKernelFamily(name);
    if (family == nullptr || !catalog.Has(name)) continue;
    const KernelPlan plan = family->plan(plan_query);
    if (plan.ok) return {name, plan.code_path, plan.reason, plan.shared_memory_bytes};
    if (too_big.empty() && plan.shared_memory_bytes > 0) {
      too_big = absl::StrCat(" (", name, "'s kernel for it needs ", plan.shared_memory_bytes,
                             " bytes of shared memory per block; the device allows ",
                             query.shared_memory_per_block, ")");
    }
  }
  std::string families;
  for (const std::string& f : catalog.families) {
    absl::StrAppend(&families, families.empty() ? "" : ", ", f);
  }
  // Name the options a family lacks, so a dropout or ALiBi request says why it cannot run.
  std::string with;
  if (query.dropout) with += " with options.dropout_p > 0";
  if (query.alibi) {
    with += query.dropout ? " and options.alibi_slopes" : " with options.alibi_slopes";
  }
  if (!with.empty()) with += " (served by: reference, the CPU device)";
  return {"", "",
          absl::StrCat("no kernel family of [", families, "] runs a ",
                       DirectionName(query.direction), " of ", kernels::DTypeName(query.dtype),
                       with, " with head_dim ", query.head_dim, " on compute capability ",
                       query.compute_capability / 10, ".", query.compute_capability % 10,
                       too_big)};
}

std::vector<CoverageRow> CoverageFor(int compute_capability, int shared_memory_per_block,
                                     const KernelCatalog& catalog) {
  std::vector<CoverageRow> rows;
  for (const std::string& name : RoutingPreference()) {
    const KernelFamilyEntry* family = kernels::FindKnownKernelFamily(name);
    if (family == nullptr || !catalog.Has(name)) continue;
    for (const kernels::CoverageRule& rule : family->coverage(compute_capability)) {
      const int max_head_dim =
          LargestPlannedHeadDim(*family, rule, compute_capability, shared_memory_per_block);
      if (max_head_dim < rule.min_head_dim) continue;
      CoverageRow out;
      out.family = name;
      out.direction = rule.direction;
      out.dtypes = rule.dtypes;
      out.min_head_dim = rule.min_head_dim;
      out.max_head_dim = max_head_dim;
      out.head_dim_multiple = rule.head_dim_multiple;
      out.dropout = rule.dropout;
      out.alibi = rule.alibi;
      out.reason = rule.reason;
      if (max_head_dim < rule.max_head_dim) {
        absl::StrAppend(&out.reason, "; on this device up to head_dim ", max_head_dim,
                        " (larger kernels need more than its ", shared_memory_per_block / 1024,
                        " KB of shared memory per block)");
      }
      rows.push_back(std::move(out));
    }
  }
  return rows;
}

}  // namespace attnserve::engine
