#include "kernels/kernel_families.h"

#include "kernels/family_plans.h"
#include "kernels/reference/reference_attention.h"
#if ATTN_HAVE_FLASH
#include "kernels/flash/flash_attention.h"
#endif
#if ATTN_HAVE_FALLBACK
#include "kernels/fallback/fallback_attention.h"
#endif
#if ATTN_HAVE_CUBLAS
#include "kernels/cublas/cublas_attention.h"
#endif

namespace attnserve::kernels {
namespace {

size_t NoForwardWorkspace(const ForwardParams&) { return 0; }
size_t NoBackwardWorkspace(const BackwardParams&, std::string_view) { return 0; }
// The families whose backward needs the same workspace on every code path.
template <size_t (*kBytes)(const BackwardParams&)>
size_t AnyPathWorkspace(const BackwardParams& params, std::string_view) {
  return kBytes(params);
}

std::vector<KernelFamilyEntry> MakeTable() {
  std::vector<KernelFamilyEntry> table;
  table.push_back({"reference", false, reference::Forward, reference::Backward,
                   NoForwardWorkspace, NoBackwardWorkspace, reference::Plan,
                   reference::Coverage, nullptr});
  table.push_back({"flash", true, nullptr, nullptr, NoForwardWorkspace, NoBackwardWorkspace,
                   flash::Plan, flash::Coverage, flash::Pin});
#if ATTN_HAVE_FLASH
  table.back().forward = flash::Forward;
  table.back().backward = flash::Backward;
  table.back().backward_workspace_bytes = flash::BackwardWorkspaceBytes;
#endif
  table.push_back({"fallback", true, nullptr, nullptr, NoForwardWorkspace, NoBackwardWorkspace,
                   fallback::Plan, fallback::Coverage, nullptr});
#if ATTN_HAVE_FALLBACK
  table.back().forward = fallback::Forward;
  table.back().backward = fallback::Backward;
  table.back().backward_workspace_bytes = AnyPathWorkspace<fallback::BackwardWorkspaceBytes>;
#endif
  table.push_back({"cublas", true, nullptr, nullptr, NoForwardWorkspace, NoBackwardWorkspace,
                   cublas::Plan, cublas::Coverage, nullptr});
#if ATTN_HAVE_CUBLAS
  table.back().forward = cublas::Forward;
  table.back().backward = cublas::Backward;
  table.back().forward_workspace_bytes = cublas::ForwardWorkspaceBytes;
  table.back().backward_workspace_bytes = AnyPathWorkspace<cublas::BackwardWorkspaceBytes>;
#endif
  return table;
}

std::vector<KernelFamilyEntry> BuiltOnly() {
  std::vector<KernelFamilyEntry> built;
  for (const KernelFamilyEntry& entry : KnownKernelFamilies()) {
    if (entry.built()) built.push_back(entry);
  }
  return built;
}

const KernelFamilyEntry* FindIn(const std::vector<KernelFamilyEntry>& table,
                                std::string_view name) {
  for (const KernelFamilyEntry& entry : table) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

}  // namespace

const std::vector<KernelFamilyEntry>& KnownKernelFamilies() {
  static const std::vector<KernelFamilyEntry> table = MakeTable();
  return table;
}

const std::vector<KernelFamilyEntry>& BuiltKernelFamilies() {
  static const std::vector<KernelFamilyEntry> table = BuiltOnly();
  return table;
}

const KernelFamilyEntry* FindKernelFamily(std::string_view name) {
  return FindIn(BuiltKernelFamilies(), name);
}

const KernelFamilyEntry* FindKnownKernelFamily(std::string_view name) {
  return FindIn(KnownKernelFamilies(), name);
}

void PinPlan(const KernelFamilyEntry& family, const KernelPlan& plan, ExecutionContext* ctx) {
  if (family.pin != nullptr) family.pin(plan, ctx);
}

}  // namespace attnserve::kernels
