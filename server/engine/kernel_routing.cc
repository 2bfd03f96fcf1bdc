#include "server/engine/kernel_routing.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "kernels/flash/shared_memory.h"
#include "kernels/kernel_families.h"

namespace attnserve::engine {
namespace {

using kernels::DType;

constexpr int kAnyCc = INT_MAX;       // no upper compute-capability bound
constexpr int kNoHeadDimBound = INT_MAX;

enum DTypeMask : unsigned { kF16 = 1, kBF16 = 2, kF32 = 4, kAllDTypes = 7 };

unsigned MaskOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return kF16;
    case DType::kBFloat16:
      return kBF16;
    case DType::kFloat32:
      return kF32;
  }
  return 0;
}

// Shared memory per block the family's kernel for a (direction, head_dim) needs on a device of
// this compute capability; 0: no kernel. Families that size their tiles to the device's limit
// (fallback, cublas, reference) have none.
using SharedMemoryNeed = int (*)(bool backward, int head_dim, int compute_capability);

// A family serves `direction` on compute capabilities [min_cc, max_cc) for the dtypes in the
// mask and head dims min..max that are multiples of `multiple`, where its kernel fits the
// device's shared memory. Each row mirrors what the family's header promises
// (kernels/<family>/*_attention.h).
struct Row {
  const char* family;
  int min_cc;
  int max_cc;
  Direction direction;
  unsigned dtypes;
  int min_head_dim;
  int max_head_dim;
  int multiple;
  const char* reason;
  SharedMemoryNeed shared_memory = nullptr;
  unsigned features = 0;  // kDropout | kAlibi: the options beyond the base semantics it serves
};

// Row::features bits (the dropout mask's contract is kernels/dropout_mask.h). On a GPU flash
// serves them where its sm80 kernels run (compute capability >= 8.0; Hopper runs those instead
// of its sm90 kernels for such requests), the fallback and cublas families everywhere; flash on
// Turing does not implement them, so routing passes over it for such requests.
constexpr unsigned kDropout = 1u << 0;
constexpr unsigned kAlibi = 1u << 1;

constexpr Direction kFwd = Direction::kForward;
constexpr Direction kBwd = Direction::kBackward;

// Best first; the first row that covers a query runs it.
constexpr Row kTable[] = {
    {"flash", 80, kAnyCc, kFwd, kF16 | kBF16, 8, 256, 8,
     "FlashAttention-2-class kernels (sm80+ mma.sync m16n8k16): fp16/bf16, head_dim a multiple "
     "of 8 up to 256; dropout and ALiBi (sm80 kernels, on Hopper too)",
     kernels::flash::SharedMemoryBytes, kDropout | kAlibi},
    {"flash", 80, kAnyCc, kBwd, kF16 | kBF16, 8, 256, 8,
     "FlashAttention-2-class backward (sm80+): fp16/bf16, head_dim a multiple of 8 up to 256; "
     "dropout and ALiBi (sm80 kernels, on Hopper too)",
     kernels::flash::SharedMemoryBytes, kDropout | kAlibi},
    {"flash", 75, 80, kFwd, kF16, 8, 64, 8,
     "flash on Turing (mma.sync m16n8k8, 64 KB shared memory): fp16, head_dim a multiple of 8 "
     "up to 64; no dropout or ALiBi",
     kernels::flash::SharedMemoryBytes},
    {"flash", 75, 80, kBwd, kF16, 8, 64, 8,
     "flash backward on Turing: fp16, head_dim a multiple of 8 up to 64; no dropout or ALiBi",
     kernels::flash::SharedMemoryBytes},
    {"fallback", 70, kAnyCc, kFwd, kAllDTypes, 1, 256, 1,
     "memory-efficient tiled kernels for sm70+ (tensor cores for fp16, and bf16 on sm80+): "
     "every dtype, head_dim 1..256; dropout and ALiBi",
     nullptr, kDropout | kAlibi},
    {"fallback", 70, kAnyCc, kBwd, kAllDTypes, 1, 256, 1,
     "memory-efficient tiled backward for sm70+: every dtype, head_dim 1..256; dropout and ALiBi",
     nullptr, kDropout | kAlibi},
    {"cublas", 70, kAnyCc, kFwd, kAllDTypes, 1, kNoHeadDimBound, 1,
     "cuBLAS GEMMs with softmax in query chunks (bounded workspace): any dtype and head_dim; "
     "dropout and ALiBi",
     nullptr, kDropout | kAlibi},
    {"cublas", 70, kAnyCc, kBwd, kAllDTypes, 1, kNoHeadDimBound, 1,
     "cuBLAS backward in query chunks: any dtype and head_dim; dropout and ALiBi", nullptr,
     kDropout | kAlibi},
    {"reference", 0, kAnyCc, kFwd, kAllDTypes, 1, kNoHeadDimBound, 1,
     "exact CPU kernels: every dtype, head_dim and device; dropout and ALiBi", nullptr,
     kDropout | kAlibi},
    {"reference", 0, kAnyCc, kBwd, kAllDTypes, 1, kNoHeadDimBound, 1,
     "exact CPU kernels: every dtype, head_dim and device; dropout and ALiBi", nullptr,
     kDropout | kAlibi},
};

bool AppliesTo(const Row& row, int compute_capability, const KernelCatalog& catalog) {
  return catalog.Has(row.family) && compute_capability >= row.min_cc &&
         compute_capability < row.max_cc;
}

// Whether the row's kernel for head_dim fits a device with this much shared memory per block
// (0: unknown, assumed to fit).
bool FitsSharedMemory(const Row& row, Direction direction, int head_dim, int compute_capability,
                      int shared_memory_per_block) {
  if (row.shared_memory == nullptr || shared_memory_per_block <= 0) return true;
  const int need = row.shared_memory(direction == Direction::kBackward, head_dim,
                                     compute_capability);
  return need > 0 && need <= shared_memory_per_block;
}

unsigned FeaturesOf(const RouteQuery& q) {
  return (q.dropout ? kDropout : 0u) | (q.alibi ? kAlibi : 0u);
}

bool RowCovers(const Row& row, const RouteQuery& q, const KernelCatalog& catalog) {
  return AppliesTo(row, q.compute_capability, catalog) && row.direction == q.direction &&
         (row.features & FeaturesOf(q)) == FeaturesOf(q) &&
         (row.dtypes & MaskOf(q.dtype)) != 0 && q.head_dim >= row.min_head_dim &&
         q.head_dim <= row.max_head_dim && q.head_dim % row.multiple == 0 &&
         FitsSharedMemory(row, q.direction, q.head_dim, q.compute_capability,
                          q.shared_memory_per_block);
}

// The largest head dim h of the row such that every head dim of the row up to h fits the
// device; below min_head_dim when none does.
int LargestFittingHeadDim(const Row& row, int compute_capability, int shared_memory_per_block) {
  if (row.shared_memory == nullptr || shared_memory_per_block <= 0) return row.max_head_dim;
  int largest = row.min_head_dim - 1;
  for (int d = row.min_head_dim; d <= row.max_head_dim; d += row.multiple) {
    if (!FitsSharedMemory(row, row.direction, d, compute_capability, shared_memory_per_block)) {
      break;
    }
    largest = d;
  }
  return largest;
}

}  // namespace

const char* DirectionName(Direction direction) {
  return direction == Direction::kForward ? "forward" : "backward";
}

bool KernelCatalog::Has(std::string_view family) const {
  return std::find(families.begin(), families.end(), family) != families.end();
}

KernelCatalog KernelCatalog::Built() {
  KernelCatalog catalog;
  for (const kernels::KernelFamilyEntry& entry : kernels::BuiltKernelFamilies()) {
    catalog.families.push_back(entry.name);
  }
  return catalog;
}

KernelCatalog KernelCatalog::Only(std::string family) {
  return KernelCatalog{{std::move(family)}};
}

Route ChooseRoute(const RouteQuery& query, const KernelCatalog& catalog) {
  std::string too_big;  // why a family that would cover the query does not fit the device
  for (const Row& row : kTable) {
    if (RowCovers(row, query, catalog)) return {row.family, row.reason};
    RouteQuery unlimited = query;
    unlimited.shared_memory_per_block = 0;
    if (too_big.empty() && RowCovers(row, unlimited, catalog)) {
      too_big = absl::StrCat(
          " (", row.family, "'s kernel for it needs ",
          row.shared_memory(query.direction == Direction::kBackward, query.head_dim,
                            query.compute_capability),
          " bytes of shared memory per block; the device allows ", query.shared_memory_per_block,
          ")");
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
  return {"", absl::StrCat("no kernel family of [", families, "] runs a ",
                           DirectionName(query.direction), " of ", kernels::DTypeName(query.dtype),
                           with, " with head_dim ", query.head_dim, " on compute capability ",
                           query.compute_capability / 10, ".", query.compute_capability % 10,
                           too_big)};
}

std::vector<CoverageRow> CoverageFor(int compute_capability, int shared_memory_per_block,
                                     const KernelCatalog& catalog) {
  std::vector<CoverageRow> rows;
  for (const Row& row : kTable) {
    if (!AppliesTo(row, compute_capability, catalog)) continue;
    const int max_head_dim =
        LargestFittingHeadDim(row, compute_capability, shared_memory_per_block);
    if (max_head_dim < row.min_head_dim) continue;
    CoverageRow out;
    out.family = row.family;
    out.direction = row.direction;
    for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
      if ((row.dtypes & MaskOf(dtype)) != 0) out.dtypes.push_back(dtype);
    }
    out.min_head_dim = row.min_head_dim;
    out.max_head_dim = max_head_dim;
    out.head_dim_multiple = row.multiple;
    out.dropout = (row.features & kDropout) != 0;
    out.alibi = (row.features & kAlibi) != 0;
    out.reason = row.reason;
    if (max_head_dim < row.max_head_dim) {
      absl::StrAppend(&out.reason, "; on this device up to head_dim ", max_head_dim,
                      " (larger kernels need more than its ", shared_memory_per_block / 1024,
                      " KB of shared memory per block)");
    }
    rows.push_back(std::move(out));
  }
  return rows;
}

}  // namespace attnserve::engine
