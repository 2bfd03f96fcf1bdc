// The 128-byte-swizzled shared-memory tiles the Hopper (sm_90a) kernels hand to wgmma, and the
// cp.async loads that fill them (forward and backward). Head dim in blocks of 64 elements, each
// block kRows x 128 bytes; tiles 1024-byte aligned, since the swizzle pattern comes from address
// bits.
#pragma once

#include <cstdint>
#include <numeric>

#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// Byte offset of 16-byte vector `vec` of row `row` in a tile of kRows rows stored as
// head-dim blocks of 64 elements (kRows x 128 bytes each), 128-byte swizzled: vector v of a row
// sits at v ^ (row % 8) within its 128-byte line.
template <int kRows>
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int vec) {
  return (vec / 8) * (kRows * 128) + row * 128 + (((vec % 8) ^ (row % 8)) * 16);
}

// Copies kRows rows of kRowVecs 16-byte vectors into a swizzled tile (cp.async; lands by the next
// wait). Rows at or past rows_valid and vectors at or past vecs_valid are zero-filled, never
// read. Every pass covers whole rows; where that is a multiple of 8 each thread's swizzle is
// fixed (one add per pass), otherwise (128 threads at head dim 256: 4 rows) it cycles through
// 8 / rows-per-pass phases.
// The last pass may cover fewer than kThreads / kRowVecs rows (384 threads, 128-row tiles).
template <int kRows, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void LoadSwizzledAsync(uint32_t smem, const Element* src,
                                                  int row_stride, int rows_valid, int vecs_valid,
                                                  int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kRowsPerPass = kThreads / kRowVecs;
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kThreads % kRowVecs == 0 && (kRowsPerPass % 8 == 0 || 8 % kRowsPerPass == 0),
                "whole rows per pass, a multiple or a divisor of the 8-row swizzle period");
  const int row0 = tid / kRowVecs;
  const int vec = tid % kRowVecs;
  const int rows_left = rows_valid - row0;
  const bool vec_valid = vec < vecs_valid;
  // Passes it and it + kPhases share a swizzle; their rows are (kPhases * kRowsPerPass) apart.
  constexpr int kPhases = kRowsPerPass % 8 == 0 ? 1 : 8 / kRowsPerPass;
  const uint32_t smem0 = smem + SwizzledOffset<kRows>(row0, vec);
  uint32_t phase_smem[kPhases];  // [0] unused
#pragma unroll
  for (int ph = 1; ph < kPhases; ++ph) {
    phase_smem[ph] = smem + SwizzledOffset<kRows>(row0 + ph * kRowsPerPass, vec);
  }
  const Element* from = src + row0 * row_stride + vec * kVecElems;
  const int pass_stride = kRowsPerPass * row_stride;
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    if (kRows % kRowsPerPass == 0 || it < kPasses - 1 || row0 < kRows - it * kRowsPerPass) {
      // Pass it has the swizzle of phase it % kPhases (phase 0: smem0's).
      const uint32_t to = (it % kPhases == 0 ? smem0 : phase_smem[it % kPhases]) +
                          (it / kPhases) * kPhases * kRowsPerPass * 128;
      ptx::CopyAsync16(to, from, vec_valid && it * kRowsPerPass < rows_left);
    }
    from = ptx::Advance(from, pass_stride);
  }
}

// gcd(kThreads, kRowVecs) for LoadSwizzledFlatAsync, at namespace scope: device code may not call
// std::gcd (a host constexpr function) even in a constant expression.
template <int kThreads, int kRowVecs>
inline constexpr int kFlatLoadGcd = std::gcd(kThreads, kRowVecs);

// Copies kRows rows of kRowVecs 16-byte vectors into a swizzled tile (cp.async; lands by the next
// wait), zero-filling rows at or past rows_valid and vectors at or past vecs_valid (nothing is
// read for them). Unlike LoadSwizzledAsync each thread takes vectors kThreads apart in the flat
// (row, vector) order, so a row of 24 vectors (head dim 192) needs no whole rows per pass. Every
// kPeriod passes a thread is back at the same vector, kPeriodRows rows on (a whole number of
// swizzle periods), so it computes kPeriod addresses and steps them: computing every pass's
// address up front took the 24-register producer 1 KB of spills at head dim 192.
template <int kRows, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void LoadSwizzledFlatAsync(uint32_t smem, const Element* src,
                                                      int row_stride, int rows_valid,
                                                      int vecs_valid, int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kPeriod = kRowVecs / kFlatLoadGcd<kThreads, kRowVecs>;
  constexpr int kPeriodRows = kThreads / kFlatLoadGcd<kThreads, kRowVecs>;
  static_assert(kRows % kPeriodRows == 0 && kPeriodRows % 8 == 0,
                "whole periods, each a whole number of 8-row swizzle periods");
#pragma unroll
  for (int p = 0; p < kPeriod; ++p) {
    const int idx = tid + p * kThreads;
    const int row = idx / kRowVecs;
    const int vec = idx % kRowVecs;
    const uint32_t to = smem + SwizzledOffset<kRows>(row, vec);
    const Element* from = src + row * row_stride + vec * kVecElems;
    const bool vec_valid = vec < vecs_valid;
#pragma unroll
    for (int r = 0; r < kRows / kPeriodRows; ++r) {
      ptx::CopyAsync16(to + r * kPeriodRows * 128,
                       ptx::Advance(from, r * kPeriodRows * row_stride),
                       vec_valid && row + r * kPeriodRows < rows_valid);
    }
  }
}

// The loader for kRows x kRowVecs tiles from kThreads threads: whole rows per thread pass
// (LoadSwizzledAsync) where kThreads is a multiple of the row's vectors, the flat order
// (LoadSwizzledFlatAsync) where it is not (128 threads, 24 vectors at head dim 192).
template <int kRows, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void LoadSwizzledTileAsync(uint32_t smem, const Element* src,
                                                      int row_stride, int rows_valid,
                                                      int vecs_valid, int tid) {
  if constexpr (kThreads % kRowVecs == 0) {
    LoadSwizzledAsync<kRows, kRowVecs, kThreads>(smem, src, row_stride, rows_valid, vecs_valid,
                                                 tid);
  } else {
    LoadSwizzledFlatAsync<kRows, kRowVecs, kThreads>(smem, src, row_stride, rows_valid,
                                                     vecs_valid, tid);
  }
}

// A consumer warp's 16 rows of a wgmma accumulator (64 rows per warpgroup; this thread's rows
// group and group + 8 of the warp's, scaled by scale[0] and scale[1]) rounded to 16 bits into
// the warp's own rows of the swizzled kRows-row tile at `tile`, which no wgmma reads any more.
// `warp` counts the consumer warps (rows 16 warp..).
template <int kRows, typename Element, int kTiles>
__device__ __forceinline__ void WriteWarpRowsToTile(uint32_t tile, const float (&acc)[kTiles][4],
                                                    const float (&scale)[2], int warp, int lane) {
  const int group = lane / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + group + 8 * h;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      const uint32_t packed =
          ptx::PackPair<Element>(acc[nt][2 * h] * scale[h], acc[nt][2 * h + 1] * scale[h]);
      ptx::StoreShared32(tile + SwizzledOffset<kRows>(row, nt) + (lane % 4) * 4, packed);
    }
  }
}

// The warp's rows written to the tile (WriteWarpRowsToTile), then copied to dst (the tile's row
// 0; rows below rows_valid, vectors below vecs_valid) with 16-byte stores.
template <int kRows, int kRowVecs, int kTiles, typename Element>
__device__ __forceinline__ void StoreWarpRowsThroughTile(uint32_t tile,
                                                         const float (&acc)[kTiles][4],
                                                         const float (&scale)[2], Element* dst,
                                                         int64_t row_stride, int rows_valid,
                                                         int vecs_valid, int warp, int lane) {
  constexpr int kVecElems = 16 / sizeof(Element);
  WriteWarpRowsToTile<kRows, Element>(tile, acc, scale, warp, lane);
  __syncwarp();
  constexpr int kPerLane = 16 * kRowVecs / 32;
#pragma unroll
  for (int it = 0; it < kPerLane; ++it) {
    const int idx = it * 32 + lane;
    const int row = warp * 16 + idx / kRowVecs;
    const int vec = idx % kRowVecs;
    if (row < rows_valid && vec < vecs_valid) {
      const uint4 value = ptx::LoadShared128(tile + SwizzledOffset<kRows>(row, vec));
      *reinterpret_cast<uint4*>(dst + row * row_stride + vec * kVecElems) = value;
    }
  }
}

}  // namespace attnserve::kernels::flash
