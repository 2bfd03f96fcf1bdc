// Compile-time geometry of the flash backward kernels (code path x element type x head dim x
// variant): a resident tile (keys or queries) and streamed tiles of the other side in shared-memory
// stages (two on Sm80, one on Sm75 and in the narrow variant at head dims 192/256). Rows are
// padded as in the forward. BwdDkDvTraits: the dK/dV kernel, wide or narrow
// (BackwardDkDvShapeFor in tile_config.h); BwdDqTraits: the deterministic dQ pass (4 warps x 16
// query rows, no dS tile).
#pragma once

#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

template <class Arch_, DType kDType, int kHeadDim_, int kWarps_, int kResidentRows_,
          int kStreamRows_, int kStages_, int kDsBuffers_>
struct BwdTraits {
  using Arch = Arch_;
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMmaM = 16;
  static constexpr int kMmaN = 8;
  static constexpr int kMmaK = 16;
  static constexpr int kWarpRows = kMmaM;
  static constexpr int kResidentRows = kResidentRows_;  // resident rows per CTA
  static constexpr int kStreamRows = kStreamRows_;          // streamed rows per stage
  static constexpr int kSTiles = kStreamRows / kMmaN;  // 8-column tiles of a warp's score tile
  static constexpr int kDTiles = kHeadDim / kMmaN;     // 8-column tiles of a gradient row block
  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kSmemRowBytes = ForwardSmemRowBytes(kHeadDim);
  static constexpr int kResidentTileBytes = kResidentRows * kSmemRowBytes;
  static constexpr int kStreamTileBytes = kStreamRows * kSmemRowBytes;
  static constexpr int kScalarBytes = kStreamRows * 4;  // lse or D of a query tile
  // Layout: resident tiles R0, R1; stage s: streamed tiles S0, S1, then (dK/dV kernel) lse, D;
  // then kDsBuffers dS^T tiles.
  static constexpr int kStages = kStages_;
  static constexpr int kStageBytes = 2 * kStreamTileBytes + 2 * kScalarBytes;
  // dS^T of a tile in 16 bits (resident keys x 64 queries, padded rows), for dQ = dS K.
  static constexpr int kDsBuffers = kDsBuffers_;
  static constexpr int kDsRowBytes = ForwardSmemRowBytes(kStreamRows);
  static constexpr int kDsBytes = kResidentRows * kDsRowBytes;
  static constexpr int kSmemBytes =
      2 * kResidentTileBytes + kStages * kStageBytes + kDsBuffers * kDsBytes;

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kHeadDim % (2 * kMmaK) == 0, "head dim: whole pairs of ldmatrix k steps");
  static_assert(kHeadDim <= kMaxBackwardHeadDim, "dK + dV must fit in registers");
  static_assert(kWarps == 4 || kWarps == 8, "4 or 8 warps");
  static_assert(kResidentRows == kWarps * kWarpRows || (kWarps == 8 && kResidentRows == 64),
                "16 resident rows per warp, or 64 keys for 8 warps (pair layout)");
  static_assert(kStages == 1 || kStages == 2, "one or two stages");
  static_assert(kStageBytes == BackwardStageBytes(kHeadDim, kStreamRows), "host and device agree");
  static_assert((kSmemRowBytes / 16) % 2 == 1, "odd 16-byte vectors per row: conflict-free");
  static_assert((kDsRowBytes / 16) % 2 == 1, "dS rows: odd 16-byte vectors: conflict-free");
  static_assert(kDTiles % 4 == 0, "atomic dQ: whole 32-column chunks");
  static_assert((kStreamRows * kRowVecs) % kThreads == 0, "tiles: whole vectors per thread");
  static_assert((kResidentRows * kRowVecs) % kThreads == 0, "tiles: whole vectors per thread");
  static_assert(kStreamRows * 2 <= kThreads, "lse and D of a tile: one float per thread");
  static_assert(ArchSupports<Arch, kDType, kHeadDim, kSmemBytes>(),
                "Sm75: fp16, head dim <= 64, 64 KB of shared memory");
};

template <class Arch, DType kDType, int kHeadDim, bool kWide>
struct BwdDkDvTraits
    : BwdTraits<Arch, kDType, kHeadDim, BackwardDkDvShapeFor<Arch>(kHeadDim, kWide).warps,
                BackwardDkDvShapeFor<Arch>(kHeadDim, kWide).key_rows,
                BackwardDkDvShapeFor<Arch>(kHeadDim, kWide).stream_rows,
                BackwardDkDvShapeFor<Arch>(kHeadDim, kWide).stages,
                BackwardDsBuffers(BackwardDkDvShapeFor<Arch>(kHeadDim, kWide))> {
  static constexpr bool kPair = BackwardDkDvShapeFor<Arch>(kHeadDim, kWide).pair;
  static_assert(BwdDkDvTraits::kSmemBytes == BackwardDkDvSmemBytes<Arch>(kHeadDim, kWide),
                "host and device agree");
};
template <class Arch, DType kDType, int kHeadDim, bool kWide>
struct BwdDqTraits
    : BwdTraits<Arch, kDType, kHeadDim, kBackwardDqWarps, kBackwardDqWarps * 16,
                kBackwardStreamRows, BackwardDkDvShapeFor<Arch>(kHeadDim, kWide).dq_stages, 0> {
  static_assert(BwdDqTraits::kSmemBytes == BackwardDqSmemBytes<Arch>(kHeadDim, kWide),
                "host and device agree");
};

}  // namespace attnserve::kernels::flash
