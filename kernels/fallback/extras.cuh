// ALiBi and dropout on the warp result-tile layout of warp_tile.cuh (lane 4g + t: rows g and
// g + 8, columns 2t and 2t + 1 of each 16 x 8 tile), used only by the kernels instantiated with
// kExtras. Rows of a tile are queries (kKeysAreRows false: forward, dQ pass) or keys (true: the
// dK/dV pass); `row0` is the sequence position of the lane's first row without g (the warp's
// first row) and `col0` that of the tile's first column, as in ScoresToPre.
#pragma once

#include <cstdint>

#include "kernels/dropout_mask.h"
#include "kernels/fallback/kernel_args.h"
#include "kernels/fallback/warp_tile.cuh"

namespace attnserve::kernels::fallback {

// The ALiBi slope of (launch sequence b, query head) in units of pre; 0 when ALiBi is off.
__device__ __forceinline__ float AlibiSlope(const ExtrasArgs& x, int b, int head) {
  if (x.alibi_slopes == nullptr) return 0.0f;
  return x.alibi_slopes[int64_t{b} * x.alibi_stride + head] * x.alibi_to_pre;
}

// pre -= slope * |query + offset - key| on every element; masking runs afterwards and overrides
// the elements a row does not see.
template <int kTiles, bool kKeysAreRows>
__device__ __forceinline__ void AddAlibi(float (&s)[kTiles][4], float slope, int row0, int col0,
                                         int offset) {
  if (slope == 0.0f) return;
  const int lane = LaneId();
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = row0 + g + (e / 2) * 8;
      const int c = col0 + n * 8 + 2 * t + (e % 2);
      const int query = kKeysAreRows ? c : r;
      const int key = kKeysAreRows ? r : c;
      const int distance = abs(query + offset - key);  // < 2^29: exact in int and in float
      s[n][e] = fmaf(-slope, static_cast<float>(distance), s[n][e]);
    }
  }
}

// One of a Philox call's four words without a dynamically indexed (local memory) array.
__device__ __forceinline__ uint32_t PickWord(const Philox4& bits, int i) {
  return i == 0 ? bits.v[0] : i == 1 ? bits.v[1] : i == 2 ? bits.v[2] : bits.v[3];
}

// Bit 4n + e set iff element e of tile n is kept (kernels/dropout_mask.h: counter {key / 4,
// query, query head, request sequence}). With query rows, col0 must be even so that a lane's two
// keys 2t and 2t + 1 share one Philox call; with key rows each element is its own call (its two
// columns are different queries).
template <int kTiles, bool kKeysAreRows>
__device__ __forceinline__ uint32_t DropoutKeepBits(const ExtrasArgs& x, int b, int head,
                                                    int row0, int col0) {
  static_assert(kTiles * 4 <= 32, "one bit per element of the lane's tiles");
  const int lane = LaneId();
  const int g = lane / 4, t = lane % 4;
  const uint32_t sequence = static_cast<uint32_t>(x.first_sequence + b);
  uint32_t keep = 0;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + g + 8 * half;
      const int col = col0 + n * 8 + 2 * t;
      const int bit = 4 * n + 2 * half;
      if constexpr (!kKeysAreRows) {
        const Philox4 bits = DropoutBits(x.dropout_seed, sequence, head, row, col);
        keep |= uint32_t{DropoutKeep(PickWord(bits, col % 4), x.dropout_threshold)} << bit;
        keep |= uint32_t{DropoutKeep(PickWord(bits, (col + 1) % 4), x.dropout_threshold)}
                << (bit + 1);
      } else {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const Philox4 bits = DropoutBits(x.dropout_seed, sequence, head, col + k, row);
          keep |= uint32_t{DropoutKeep(PickWord(bits, row % 4), x.dropout_threshold)}
                  << (bit + k);
        }
      }
    }
  }
  return keep;
}

// x * (1 / (1 - p)) where kept, 0 where dropped: `out` may be `in`.
template <int kTiles>
__device__ __forceinline__ void ApplyDropout(float (&out)[kTiles][4], const float (&in)[kTiles][4],
                                             uint32_t keep, float scale) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[n][e] = (keep >> (4 * n + e)) & 1u ? in[n][e] * scale : 0.0f;
  }
}

}  // namespace attnserve::kernels::fallback
