#include "kernels/kernel_plan.h"

#include <algorithm>
#include <utility>

namespace attnserve::kernels {
namespace {

std::string CcName(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

bool Serves(const CoverageRule& rule, DType dtype) {
  return std::find(rule.dtypes.begin(), rule.dtypes.end(), dtype) != rule.dtypes.end();
}

// Why `rule`, which applies to the query's direction and architecture, does not cover it;
// empty when it does.
std::string RuleProblem(const CoverageRule& rule, const PlanQuery& q) {
  if (!Serves(rule, q.dtype)) return std::string(DTypeName(q.dtype)) + " is not supported";
  if (q.head_dim < rule.min_head_dim || q.head_dim > rule.max_head_dim ||
      q.head_dim % rule.head_dim_multiple != 0) {
    std::string bound = rule.max_head_dim == kNoHeadDimBound
                            ? "from " + std::to_string(rule.min_head_dim)
                            : std::to_string(rule.min_head_dim) + ".." +
                                  std::to_string(rule.max_head_dim);
    if (rule.head_dim_multiple > 1) {
      bound = "multiples of " + std::to_string(rule.head_dim_multiple) + ", " + bound;
    }
    return "head_dim " + std::to_string(q.head_dim) + " is not supported (" + bound + ")";
  }
  if (q.dropout && !rule.dropout) return "dropout is not supported";
  if (q.alibi && !rule.alibi) return "ALiBi is not supported";
  return "";
}

}  // namespace

CoverageRule MakeRule(Direction direction, int min_cc, int max_cc, std::vector<DType> dtypes,
                      int min_head_dim, int max_head_dim, int multiple, bool extras,
                      const char* reason) {
  CoverageRule rule;
  rule.min_cc = min_cc;
  rule.max_cc = max_cc;
  rule.direction = direction;
  rule.dtypes = std::move(dtypes);
  rule.min_head_dim = min_head_dim;
  rule.max_head_dim = max_head_dim;
  rule.head_dim_multiple = multiple;
  rule.dropout = extras;
  rule.alibi = extras;
  rule.reason = reason;
  return rule;
}

std::vector<DType> AllDTypes() { return {DType::kFloat16, DType::kBFloat16, DType::kFloat32}; }

const CoverageRule* MatchRule(const std::vector<CoverageRule>& rules, const PlanQuery& query,
                              std::string* why_not) {
  std::string problem;  // the first applicable rule's (rules come best first)
  for (const CoverageRule& rule : rules) {
    if (rule.direction != query.direction || query.compute_capability < rule.min_cc ||
        query.compute_capability >= rule.max_cc) {
      continue;
    }
    std::string rule_problem = RuleProblem(rule, query);
    if (rule_problem.empty()) return &rule;
    if (problem.empty()) problem = std::move(rule_problem);
  }
  *why_not = problem.empty() ? std::string("no ") + DirectionName(query.direction) +
                                   " kernels for compute capability " +
                                   CcName(query.compute_capability)
                             : problem + " on compute capability " +
                                   CcName(query.compute_capability);
  return nullptr;
}

KernelPlan PlanFromRule(const CoverageRule* rule, std::string why_not, std::string code_path) {
  KernelPlan plan;
  if (rule == nullptr) {
    plan.reason = std::move(why_not);
    return plan;
  }
  plan.ok = true;
  plan.code_path = std::move(code_path);
  plan.reason = rule->reason;
  return plan;
}

KernelPlan PlanByRules(const std::vector<CoverageRule>& rules, const PlanQuery& query,
                       std::string code_path) {
  std::string why_not;
  const CoverageRule* rule = MatchRule(rules, query, &why_not);
  return PlanFromRule(rule, std::move(why_not), std::move(code_path));
}

}  // namespace attnserve::kernels
