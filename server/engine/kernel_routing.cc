#include "server/engine/kernel_routing.h"

#include "absl/strings/str_cat.h"

namespace attnserve::engine {
namespace {

// What kernels/flash covers (flash_attention.h): fp16/bf16 tensor-core kernels for sm80+,
// head dims that are multiples of 8, up to 256 forward and 128 backward.
constexpr int kFlashMinComputeCapability = 80;
constexpr int kFlashHeadDimMultiple = 8;
constexpr int kFlashMaxForwardHeadDim = 256;
constexpr int kFlashMaxBackwardHeadDim = 128;

struct Row {
  const char* family;
  bool (*covers)(const RouteQuery&, const KernelCatalog&);
  const char* reason;
};

bool FlashCovers(const RouteQuery& q, const KernelCatalog& catalog) {
  const int max_head_dim = q.direction == Direction::kForward ? kFlashMaxForwardHeadDim
                                                              : kFlashMaxBackwardHeadDim;
  return catalog.flash && q.compute_capability >= kFlashMinComputeCapability &&
         q.dtype != kernels::DType::kFloat32 && q.head_dim % kFlashHeadDimMultiple == 0 &&
         q.head_dim <= max_head_dim;
}

bool ReferenceCovers(const RouteQuery&, const KernelCatalog&) { return true; }

// Best first; the first row that covers a query runs it.
constexpr Row kTable[] = {
    {"flash", FlashCovers,
     "sm80+ tensor cores, fp16/bf16, head_dim a multiple of 8 up to 256 (backward up to 128)"},
    {"reference", ReferenceCovers, "exact CPU kernels: every dtype, head_dim and device"},
};

}  // namespace

Route ChooseRoute(const RouteQuery& query, const KernelCatalog& catalog) {
  for (const Row& row : kTable) {
    if (row.covers(query, catalog)) return {row.family, row.reason};
  }
  return {"reference", "no other family covers this request"};
}

bool Covers(const std::string& family, const RouteQuery& query, const KernelCatalog& catalog) {
  for (const Row& row : kTable) {
    if (family == row.family) return row.covers(query, catalog);
  }
  return false;
}

std::vector<std::string> KnownFamilies() {
  std::vector<std::string> families;
  for (const Row& row : kTable) families.push_back(row.family);
  return families;
}

}  // namespace attnserve::engine
