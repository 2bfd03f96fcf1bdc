#include "kernels/cublas/chunk_plan.h"

#include <algorithm>
#include <limits>

namespace attnserve::kernels::cublas {
namespace {

// Sizes saturate here, far below SIZE_MAX, so sums of a few of them still cannot wrap.
constexpr size_t kSaturated = std::numeric_limits<size_t>::max() / 16;

size_t AlignRegion(size_t bytes) {
  if (bytes >= kSaturated) return kSaturated;
  return (bytes + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

size_t SaturatingAdd(size_t a, size_t b) {
  return std::min(kSaturated, std::min(a, kSaturated) + std::min(b, kSaturated));
}

size_t SaturatingMul(size_t a, size_t b) {
  if (a == 0 || b == 0) return 0;
  if (a >= kSaturated || b >= kSaturated || a > kSaturated / b) return kSaturated;
  return a * b;
}

int64_t ScoreStride(int64_t len_k) {
  return std::max<int64_t>(kScoreRowGranule,
                           CeilDiv(len_k, kScoreRowGranule) * kScoreRowGranule);
}

ChunkLayout Layout(const ChunkGeometry& g, int kv_heads, int64_t rows) {
  ChunkLayout layout;
  layout.kv_heads = kv_heads;
  layout.rows = rows;
  layout.ld = ScoreStride(g.len_k);
  const bool backward = g.pass == Pass::kBackward;
  const bool fp32 = g.dtype == DType::kFloat32;
  layout.has_accumulators = backward && !fp32;

  size_t offset = 0;
  auto region = [&offset](size_t bytes) {
    const size_t at = offset;
    offset = SaturatingAdd(offset, AlignRegion(bytes));
    return at;
  };
  const size_t scores = SaturatingMul(
      SaturatingMul(static_cast<size_t>(kv_heads) * static_cast<size_t>(g.group),
                    static_cast<size_t>(rows)),
      static_cast<size_t>(layout.ld));
  if (layout.has_accumulators) {
    const size_t accum = SaturatingMul(
        SaturatingMul(static_cast<size_t>(kv_heads), static_cast<size_t>(g.len_k)),
        static_cast<size_t>(g.head_dim) * sizeof(float));
    layout.dk_accum = region(accum);
    layout.dv_accum = region(accum);
  }
  layout.scores = region(SaturatingMul(scores, sizeof(float)));
  if (backward) layout.dprobs = region(SaturatingMul(scores, sizeof(float)));
  if (fp32) {
    layout.probs = layout.scores;
    layout.dscores = layout.dprobs;
  } else {
    layout.probs = region(SaturatingMul(scores, 2));
    if (backward) layout.dscores = region(SaturatingMul(scores, 2));
  }
  layout.bytes = offset;
  return layout;
}

namespace {

// Bytes per score element over all score buffers of a chunk, and how many such buffers.
size_t ScoreBytes(const ChunkGeometry& g) {
  const bool backward = g.pass == Pass::kBackward;
  if (g.dtype == DType::kFloat32) return backward ? 8 : 4;
  return backward ? 12 : 6;
}

size_t ScoreRegions(const ChunkGeometry& g) {
  const bool backward = g.pass == Pass::kBackward;
  if (g.dtype == DType::kFloat32) return backward ? 2 : 1;
  return backward ? 4 : 2;
}

size_t BytesPerRow(const ChunkGeometry& g, int kv_heads) {
  return SaturatingMul(
      SaturatingMul(static_cast<size_t>(kv_heads) * static_cast<size_t>(g.group),
                    static_cast<size_t>(ScoreStride(g.len_k))),
      ScoreBytes(g));
}

size_t FixedBytes(const ChunkGeometry& g, int kv_heads) {
  return SaturatingAdd(Layout(g, kv_heads, 0).bytes, ScoreRegions(g) * kRegionAlignment);
}

}  // namespace

size_t ScratchBound(const ChunkGeometry& g, int kv_heads, int64_t rows) {
  return SaturatingAdd(FixedBytes(g, kv_heads),
                       SaturatingMul(BytesPerRow(g, kv_heads), static_cast<size_t>(rows)));
}

bool PlanChunks(const ChunkGeometry& g, int num_heads_k, int64_t len_q, size_t available,
                ChunkLayout* plan) {
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int kv_heads = num_heads_k; kv_heads >= 1; --kv_heads) {
    const size_t fixed = FixedBytes(g, kv_heads);
    if (fixed > available) continue;
    const int64_t rows = static_cast<int64_t>(std::min<size_t>(
        (available - fixed) / BytesPerRow(g, kv_heads), static_cast<size_t>(len_q)));
    if (rows < 1) continue;
    const int64_t cost = CeilDiv(num_heads_k, kv_heads) * CeilDiv(len_q, rows);
    if (cost < best_cost) {
      best_cost = cost;
      *plan = Layout(g, kv_heads, rows);
    }
    if (cost == 1) break;
  }
  return best_cost != std::numeric_limits<int64_t>::max();
}

}  // namespace attnserve::kernels::cublas
