// Element-wise dropout and ALiBi on the mma accumulator tiles of the sm80 kernels, in both of
// their layouts. Row layout (forward, deterministic dQ pass): a thread holds query rows
// `row` and row + 8 (h = 0, 1) and, of each 8-key tile nt, keys first_col + 8 nt + {0, 1}, as
// [nt][2 h + e]. Column layout (the dK/dV kernels compute S^T): key rows `key` and key + 8,
// query columns first_row + 8 nt + {0, 1}. Only extras instantiations include this.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/dropout_mask.h"
#include "kernels/flash/extras_args.h"

namespace attnserve::kernels::flash {

// The slope of (launch sequence `batch`, query head `head`) in pre-score units; 0 when off
// (then every bias below is an exact no-op, but callers skip the work).
__device__ __forceinline__ float AlibiSlopePre(const ExtrasArgs& x, int batch, int head) {
  return x.alibi_slopes == nullptr
             ? 0.0f
             : x.alibi_slopes[int64_t{batch} * x.alibi_stride + head] * x.alibi_to_pre;
}

// Softcap's factor 1 - tanh^2 from s (holding tanh), kept aside before ALiBi shifts s: P and dS
// then follow the no-softcap code, and dS takes this factor.
template <int kTiles>
__device__ __forceinline__ void SoftcapGradient(const float (&s)[kTiles][4],
                                                float (&grad)[kTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) grad[nt][e] = 1.0f - s[nt][e] * s[nt][e];
  }
}

// s -= slope * |i + len_k - len_q - j|; `aligned` is the key on row `row`'s diagonal.
template <int kTiles>
__device__ __forceinline__ void AlibiRowTile(float (&s)[kTiles][4], float slope, int aligned,
                                             int first_col) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rel = aligned + 8 * h - first_col;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float distance = fabsf(static_cast<float>(rel - nt * 8 - e));
        s[nt][2 * h + e] = fmaf(-slope, distance, s[nt][2 * h + e]);
      }
    }
  }
}

// The same in the column layout: `first_aligned` is the key on query column first_row's
// diagonal (first_row + len_k - len_q).
template <int kTiles>
__device__ __forceinline__ void AlibiColTile(float (&s)[kTiles][4], float slope, int key,
                                             int first_aligned) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rel = first_aligned - key - 8 * h;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float distance = fabsf(static_cast<float>(rel + nt * 8 + e));
        s[nt][2 * h + e] = fmaf(-slope, distance, s[nt][2 * h + e]);
      }
    }
  }
}

// The keep bits of the 4 columns one Philox call decides, as bits 0-3 (word k -> bit k).
__device__ __forceinline__ uint32_t KeepNibble(const Philox4& bits, uint32_t threshold) {
  return uint32_t{DropoutKeep(bits.v[0], threshold)} |
         uint32_t{DropoutKeep(bits.v[1], threshold)} << 1 |
         uint32_t{DropoutKeep(bits.v[2], threshold)} << 2 |
         uint32_t{DropoutKeep(bits.v[3], threshold)} << 3;
}

// Row layout: x -> x * kept_factor where kept, 0 where dropped. A thread's two keys of a tile
// (first_col even) lie in one group of four, whose other two belong to the neighbouring lane
// of the quad (lane ^ 1) on the same row: one Philox call serves both lanes, so each computes
// every other tile's (the even lane tiles 2m, the odd one 2m + 1) and they swap keep bits.
template <int kTiles>
__device__ __forceinline__ void DropoutRowTile(float (&s)[kTiles][4], const ExtrasArgs& x,
                                               uint32_t sequence, uint32_t head, int row,
                                               int first_col, float kept_factor) {
  static_assert(kTiles % 2 == 0, "pairs of 8-key tiles");
  const int odd = (first_col >> 1) & 1;  // columns 2, 3 of the group of four: words 2, 3
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int m = 0; m < kTiles / 2; ++m) {
      const Philox4 bits =
          DropoutBits(x.dropout_seed, sequence, head, static_cast<uint32_t>(row + 8 * h),
                      static_cast<uint32_t>(first_col + (2 * m + odd) * 8));
      // Bits 0-3: tile 2m's four keys, 4-7: tile 2m + 1's.
      uint32_t keep = KeepNibble(bits, x.dropout_threshold) << (4 * odd);
      keep |= __shfl_xor_sync(0xffffffffu, keep, 1);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = s[2 * m + t][2 * h + e];
          v = (keep >> (4 * t + 2 * odd + e)) & 1u ? v * kept_factor : 0.0f;
        }
      }
    }
  }
}

// Column layout: which elements are kept. Neighbouring query columns are different counters,
// but one call decides a query row's four keys key & ~3 .. + 3, held by the four lanes
// lane ^ {0, 4, 8, 12} (groups 4c .. 4c + 3, the key's low bits; key rows start at multiples of
// 4): each of them computes one call of every four elements and the four nibbles of keep bits
// are gathered in two shuffles.
template <int kTiles>
__device__ __forceinline__ void DropoutKeepColTile(bool (&keep)[kTiles][4], const ExtrasArgs& x,
                                                   uint32_t sequence, uint32_t head, int key,
                                                   int first_row) {
  static_assert(kTiles % 2 == 0, "whole groups of four elements (pairs of tiles)");
  const int j = key & 3;  // this lane's word of each call, and its place among the four lanes
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Elements i = 2 nt + e in groups of four: 4 g + j is this lane's call.
#pragma unroll
    for (int g = 0; g < kTiles / 2; ++g) {
      const int mine = 4 * g + j;
      const Philox4 bits =
          DropoutBits(x.dropout_seed, sequence, head,
                      static_cast<uint32_t>(first_row + (mine / 2) * 8 + mine % 2),
                      static_cast<uint32_t>(key + 8 * h));
      uint32_t all = KeepNibble(bits, x.dropout_threshold) << (4 * j);
      all |= __shfl_xor_sync(0xffffffffu, all, 4);
      all |= __shfl_xor_sync(0xffffffffu, all, 8);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        keep[2 * g + i / 2][2 * h + i % 2] = (all >> (4 * i + j)) & 1u;
      }
    }
  }
}

}  // namespace attnserve::kernels::flash
