#include "kernels/kernel_families.h"

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
size_t NoBackwardWorkspace(const BackwardParams&) { return 0; }

std::vector<KernelFamilyEntry> MakeTable() {
  std::vector<KernelFamilyEntry> table;
  table.push_back({"reference", false, reference::Forward, reference::Backward,
                   NoForwardWorkspace, NoBackwardWorkspace});
#if ATTN_HAVE_FLASH
  table.push_back({"flash", true, flash::Forward, flash::Backward, NoForwardWorkspace,
                   flash::BackwardWorkspaceBytes});
#endif
#if ATTN_HAVE_FALLBACK
  table.push_back({"fallback", true, fallback::Forward, fallback::Backward, NoForwardWorkspace,
                   fallback::BackwardWorkspaceBytes});
#endif
#if ATTN_HAVE_CUBLAS
  table.push_back({"cublas", true, cublas::Forward, cublas::Backward,
                   cublas::ForwardWorkspaceBytes, cublas::BackwardWorkspaceBytes});
#endif
  return table;
}

}  // namespace

const std::vector<KernelFamilyEntry>& BuiltKernelFamilies() {
  static const std::vector<KernelFamilyEntry> table = MakeTable();
  return table;
}

const KernelFamilyEntry* FindKernelFamily(std::string_view name) {
  for (const KernelFamilyEntry& entry : BuiltKernelFamilies()) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

}  // namespace attnserve::kernels
