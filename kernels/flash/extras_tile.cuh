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

// Row layout: x -> x * kept_factor where kept, 0 where dropped. A thread's two keys of a tile
// (first_col even) lie in one group of four, so one Philox call serves both.
template <int kTiles>
__device__ __forceinline__ void DropoutRowTile(float (&s)[kTiles][4], const ExtrasArgs& x,
                                               uint32_t sequence, uint32_t head, int row,
                                               int first_col, float kept_factor) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      const int col = first_col + nt * 8;
      const Philox4 bits =
          DropoutBits(x.dropout_seed, sequence, head, static_cast<uint32_t>(row + 8 * h),
                      static_cast<uint32_t>(col));
      const bool upper = (col & 2) != 0;
      const uint32_t b0 = upper ? bits.v[2] : bits.v[0];
      const uint32_t b1 = upper ? bits.v[3] : bits.v[1];
      float& x0 = s[nt][2 * h];
      float& x1 = s[nt][2 * h + 1];
      x0 = DropoutKeep(b0, x.dropout_threshold) ? x0 * kept_factor : 0.0f;
      x1 = DropoutKeep(b1, x.dropout_threshold) ? x1 * kept_factor : 0.0f;
    }
  }
}

// Column layout: which elements are kept. Neighbouring query columns are different counters,
// so each element takes its own Philox call (sharing them across lanes is future work).
template <int kTiles>
__device__ __forceinline__ void DropoutKeepColTile(bool (&keep)[kTiles][4], const ExtrasArgs& x,
                                                   uint32_t sequence, uint32_t head, int key,
                                                   int first_row) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int col = key + 8 * h;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const Philox4 bits =
            DropoutBits(x.dropout_seed, sequence, head,
                        static_cast<uint32_t>(first_row + nt * 8 + e), static_cast<uint32_t>(col));
        // Selects, not bits.v[col % 4]: a run-time index would put the array in local memory.
        const uint32_t lo = (col & 1) ? bits.v[1] : bits.v[0];
        const uint32_t hi = (col & 1) ? bits.v[3] : bits.v[2];
        keep[nt][2 * h + e] = DropoutKeep((col & 2) ? hi : lo, x.dropout_threshold);
      }
    }
  }
}

}  // namespace attnserve::kernels::flash
