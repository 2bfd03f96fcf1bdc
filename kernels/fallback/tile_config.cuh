// Compile-time tile geometry of each fallback kernel: the largest tiles that fit the shared
// memory of the smallest GPU the path runs on, with a register budget per thread in mind.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/fallback/kernel_args.h"
#include "kernels/fallback/warp_tile.cuh"

namespace attnserve::kernels::fallback {

// Opt-in shared memory per block of the smallest GPU each path runs on: a T4 (sm75) allows
// 64 KB, so every path that runs below sm80 fits there (a V100 allows 96 KB); sm80+ paths fit
// the 99 KB of sm86/sm89 (the A100 and H100 allow more).
template <Path P>
inline constexpr int kSmemBudget = P == Path::kMma16816 ? 99 * 1024 : 64 * 1024 - 1024;

// Rows are padded by 16 bytes: ldmatrix/wmma row addresses stay 16-byte aligned and the eight
// rows an ldmatrix reads (or the g = 0..7 rows of a SIMT read) fall into distinct banks.
template <typename T, int kHeadDim>
inline constexpr int kRowStride = kHeadDim + 16 / static_cast<int>(sizeof(T));

// Smallest row/key tile: 16 for tensor cores (their k extent), 8 for SIMT.
template <Path P>
inline constexpr int kMinTile = P == Path::kSimt ? 8 : 16;

constexpr int AlignUp(int x, int a) { return (x + a - 1) / a * a; }

// Shared-memory stages of the tiles the backward passes stream: two where cp.async can fill one
// while the CTA computes on the other (the forward overlaps its K and V buffers instead).
template <Path P>
inline constexpr int kStages = kAsyncCopy<P> ? 2 : 1;

struct FwdTiles {
  int warps;
  int block_n;
  int smem;
};

// Forward (and the dQ pass, with `dq` = true: Q and dO resident, K and V streamed): warps of 16
// query rows, key tiles of block_n. Preference: 4 warps, then the largest key tile within the
// budget. Key tiles of 64 up to head dim 128 and 32 above keep S (block_n / 2 floats per thread)
// next to O (head_dim / 2) under the 255-register limit.
template <Path P, typename T, int kHeadDim>
constexpr FwdTiles ChooseFwdTiles(bool dq) {
  constexpr int stride = kRowStride<T, kHeadDim>;
  const int row_bytes = stride * static_cast<int>(sizeof(T));
  const int first_n = kHeadDim <= 128 ? 64 : 32;
  for (int warps = 4; warps >= 1; warps /= 2) {
    for (int n = first_n; n >= kMinTile<P>; n /= 2) {
      const int resident = (dq ? 2 : 1) * warps * 16 * row_bytes;
      const int streamed = (dq ? kStages<P> : 1) * 2 * n * row_bytes;
      const int smem = AlignUp(resident, 128) + AlignUp(streamed, 128) +
                       warps * AlignUp(ScratchBytesPerWarp<P>(n), 128);
      if (smem <= kSmemBudget<P>) return {warps, n, smem};
    }
  }
  return {0, 0, 0};
}

struct BwdTiles {
  int key_groups;  // groups of 16 keys per CTA
  int col_split;   // warps per key group, each owning head_dim / col_split columns of dK/dV
  int block_m;     // query rows per streamed tile
  int smem;
};

// dK/dV pass: K and V of key_groups * 16 keys resident, Q/dO tiles of block_m rows streamed.
// Above head dim 128 two warps share a key group, each accumulating half of dK and dV's
// columns (dK + dV are head_dim / col_split floats per thread).
template <Path P, typename T, int kHeadDim>
constexpr BwdTiles ChooseBwdTiles() {
  constexpr int stride = kRowStride<T, kHeadDim>;
  const int row_bytes = stride * static_cast<int>(sizeof(T));
  const int col_split = kHeadDim > 128 ? 2 : 1;
  const int first_m = kHeadDim / col_split <= 64 ? 64 : 32;
  for (int groups = 4 / col_split; groups >= 1; groups /= 2) {
    for (int m = first_m; m >= kMinTile<P>; m /= 2) {
      const int resident = 2 * groups * 16 * row_bytes;
      const int streamed = kStages<P> * (2 * m * row_bytes + 2 * m * 4);
      const int smem = AlignUp(resident, 128) + AlignUp(streamed, 128) +
                       groups * col_split * AlignUp(ScratchBytesPerWarp<P>(m), 128);
      if (smem <= kSmemBudget<P>) return {groups, col_split, m, smem};
    }
  }
  return {0, 0, 0, 0};
}

template <Path P, typename T, int kHeadDim, bool kDq = false>
struct FwdConfig {
  using Element = T;
  static constexpr Path kPath = P;
  static constexpr int kDim = kHeadDim;
  static constexpr FwdTiles kTiles = ChooseFwdTiles<P, T, kHeadDim>(kDq);
  static_assert(kTiles.warps > 0, "no tile fits the shared-memory budget");
  static constexpr int kWarps = kTiles.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16;
  static constexpr int kBlockN = kTiles.block_n;
  static constexpr int kStride = kRowStride<T, kHeadDim>;
  static constexpr int kSmemBytes = kTiles.smem;
  static constexpr int kResidentBytes =
      AlignUp((kDq ? 2 : 1) * kBlockM * kStride * int{sizeof(T)}, 128);  // Q (and dO)
  static constexpr int kStages = kDq ? fallback::kStages<P> : 1;
  static constexpr int kStageBytes = 2 * kBlockN * kStride * int{sizeof(T)};  // K + V
  static constexpr int kStreamedBytes = AlignUp(kStages * kStageBytes, 128);
  static constexpr int kScratchBytes = AlignUp(ScratchBytesPerWarp<P>(kBlockN), 128);
  static_assert(kHeadDim % 16 == 0 && kBlockN % kMinTile<P> == 0, "tile geometry");
};

template <Path P, typename T, int kHeadDim>
struct BwdConfig {
  using Element = T;
  static constexpr Path kPath = P;
  static constexpr int kDim = kHeadDim;
  static constexpr BwdTiles kTiles = ChooseBwdTiles<P, T, kHeadDim>();
  static_assert(kTiles.key_groups > 0, "no tile fits the shared-memory budget");
  static constexpr int kColSplit = kTiles.col_split;
  static constexpr int kColumns = kHeadDim / kColSplit;  // dK/dV columns per warp
  static constexpr int kWarps = kTiles.key_groups * kColSplit;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = kTiles.key_groups * 16;  // keys per CTA
  static constexpr int kBlockM = kTiles.block_m;          // query rows per streamed tile
  static constexpr int kStride = kRowStride<T, kHeadDim>;
  static constexpr int kSmemBytes = kTiles.smem;
  static constexpr int kResidentBytes = AlignUp(2 * kBlockN * kStride * int{sizeof(T)}, 128);
  static constexpr int kStages = fallback::kStages<P>;
  static constexpr int kStageBytes = 2 * kBlockM * kStride * int{sizeof(T)} + 2 * kBlockM * 4;
  static constexpr int kStreamedBytes = AlignUp(kStages * kStageBytes, 128);
  static constexpr int kScratchBytes = AlignUp(ScratchBytesPerWarp<P>(kBlockM), 128);
  static_assert(kColumns % 16 == 0, "column split");
};

}  // namespace attnserve::kernels::fallback
