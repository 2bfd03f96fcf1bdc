// Compile-time geometry of the flash backward kernels (code path x element type x head dim): each
// of 4 warps owns 16 rows of a 64-row resident tile, 64-row tiles of the other side stream
// through shared-memory stages (two on Sm80, one on Sm75). Rows are padded as in the forward.
#pragma once

#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

template <class Arch_, DType kDType, int kHeadDim_>
struct BwdTraits {
  using Arch = Arch_;
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kBackwardWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlock = kBackwardBlock;  // resident rows = streamed rows per stage
  static constexpr int kMmaM = 16;
  static constexpr int kMmaN = 8;
  static constexpr int kMmaK = 16;
  static constexpr int kWarpRows = kBlock / kWarps;
  static constexpr int kSTiles = kBlock / kMmaN;    // 8-column tiles of a 16 x 64 score tile
  static constexpr int kDTiles = kHeadDim / kMmaN;  // 8-column tiles of a gradient row block
  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kSmemRowBytes = ForwardSmemRowBytes(kHeadDim);
  static constexpr int kTileBytes = kBlock * kSmemRowBytes;
  static constexpr int kScalarBytes = kBlock * 4;  // 64 floats (lse or D of a query tile)
  // Layout: resident tiles R0, R1; stage s: streamed tiles S0, S1, then (dK/dV kernel) lse, D.
  static constexpr int kStages = BackwardStages<Arch>();
  static constexpr int kStageBytes = 2 * kTileBytes + 2 * kScalarBytes;
  // dS^T of the current tile in 16 bits (64 keys x 64 queries, padded rows), for dQ = dS K.
  static constexpr int kDsRowBytes = ForwardSmemRowBytes(kBlock);
  static constexpr int kDsBytes = kBlock * kDsRowBytes;
  static constexpr int kSmemBytes = 2 * kTileBytes + kStages * kStageBytes + kDsBytes;

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kHeadDim % (2 * kMmaK) == 0, "head dim: whole pairs of ldmatrix k steps");
  static_assert(kHeadDim <= kMaxBackwardHeadDim, "dK + dV must fit in registers");
  static_assert(kWarpRows == kMmaM, "one 16-row mma tile per warp");
  static_assert((kSmemRowBytes / 16) % 2 == 1, "odd 16-byte vectors per row: conflict-free");
  static_assert((kDsRowBytes / 16) % 2 == 1, "dS rows: odd 16-byte vectors: conflict-free");
  static_assert(kDTiles % 4 == 0, "atomic dQ: whole 32-column chunks");
  static_assert((kBlock * kRowVecs) % kThreads == 0, "tiles: whole vectors per thread");
  static_assert(kBlock * 2 <= kThreads, "lse and D of a tile: one float per thread");
  static_assert(kSmemBytes == BackwardSmemBytes<Arch>(kHeadDim), "host and device agree");
  static_assert(ArchSupports<Arch, kDType, kHeadDim, kSmemBytes>(),
                "Sm75: fp16, head dim <= 64, 64 KB of shared memory");
};

}  // namespace attnserve::kernels::flash
