// Compile-time geometry of one flash forward kernel (code path x element type x head dim): tile
// sizes from the heuristic, the mma tiling per warp, and the shared-memory layout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/attention_params.h"
#include "kernels/flash/arch.h"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = __nv_bfloat16;
};

// What the Sm75 path supports: fp16 (Turing has no bf16 mma), head dims up to 64, 64 KB of
// shared memory per block.
template <class Arch, DType kDType, int kHeadDim, int kSmemBytes>
constexpr bool ArchSupports() {
  if constexpr (Arch::kBFloat16) {
    return true;
  } else {
    return kDType == DType::kFloat16 && kHeadDim <= Arch::kMaxHeadDim &&
           kSmemBytes <= Arch::kSmemPerBlock;
  }
}

template <class Arch_, DType kDType, int kHeadDim_>
struct FwdTraits {
  using Arch = Arch_;
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr ForwardTiles kTiles = ForwardTilesFor<Arch>(kHeadDim);
  static constexpr int kBlockM = kTiles.block_m;
  static constexpr int kBlockN = kTiles.block_n;
  static constexpr int kWarps = kTiles.warps;
  static constexpr int kThreads = kWarps * 32;

  // mma.sync m16n8k16 tiling: each warp owns kWarpRows consecutive query rows of the block.
  static constexpr int kMmaM = 16;
  static constexpr int kMmaN = 8;
  static constexpr int kMmaK = 16;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / kMmaM;   // row tiles per warp
  static constexpr int kSTiles = kBlockN / kMmaN;     // key tiles of S per row tile
  static constexpr int kOTiles = kHeadDim / kMmaN;    // head-dim tiles of O per row tile
  static constexpr int kQkSteps = kHeadDim / kMmaK;   // k steps of S = Q K^T
  static constexpr int kPvSteps = kBlockN / kMmaK;    // k steps of O += P V

  // Global <-> shared traffic moves 16-byte vectors of 8 elements.
  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kSmemRowBytes = ForwardSmemRowBytes(kHeadDim);
  static constexpr int kQSmemBytes = kBlockM * kSmemRowBytes;
  static constexpr int kKvSmemBytes = kBlockN * kSmemRowBytes;
  static constexpr int kSmemBytes = ForwardSmemBytes<Arch>(kHeadDim);

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kVecElems == kHeadDimGranule, "head-dim granule is one 16-byte vector");
  static_assert(kHeadDim % (2 * kMmaK) == 0, "head dim: whole pairs of ldmatrix k steps");
  static_assert(kBlockN % kMmaK == 0, "key tile: whole 16-key steps (pairs of 8-key mma tiles)");
  static_assert(kWarpRows % kMmaM == 0 && kMTiles >= 1, "warp rows: whole 16-row mma tiles");
  static_assert((kSmemRowBytes / 16) % 2 == 1,
                "an odd number of 16-byte vectors per row: 8 rows of an ldmatrix hit 8 bank groups");
  static_assert((kBlockM * kRowVecs) % kThreads == 0, "Q tile: whole vectors per thread");
  static_assert((kBlockN * kRowVecs) % kThreads == 0, "K/V tile: whole vectors per thread");
  static_assert((kWarpRows * kRowVecs) % 32 == 0, "output rows: whole vectors per lane");
  static_assert(kSmemBytes == kQSmemBytes + 2 * kKvSmemBytes, "shared memory layout");
  static_assert(ArchSupports<Arch, kDType, kHeadDim, kSmemBytes>(),
                "Sm75: fp16, head dim <= 64, 64 KB of shared memory");
};

}  // namespace attnserve::kernels::flash
