// Score-tile steps shared by the forward and both backward passes, on the warp result-tile
// layout of warp_tile.cuh (lane 4g + t: rows g and g + 8, columns 2t and 2t + 1 of each 16 x 8
// tile).
#pragma once

#include <math_constants.h>

#include "kernels/fallback/kernel_args.h"
#include "kernels/fallback/warp_tile.cuh"

namespace attnserve::kernels::fallback {

// tanh with absolute error ~1e-7 through exp2 (tanh.approx's 5e-4 would show after the
// multiplication by softcap), saturating to +-1.
__device__ __forceinline__ float AccurateTanh(float x) {
  constexpr float kTwoLog2e = 2.8853900817779268f;
  return 1.0f - 2.0f / (1.0f + ptx::Exp2(x * kTwoLog2e));
}

// Softcap: pre = tanh(s * softcap_input_scale) (the kernels' score unit; score = pre * lse_scale).
template <int kTiles>
__device__ __forceinline__ void SoftcapScores(float (&s)[kTiles][4], const FwdArgs& a) {
  if (a.softcap) {
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = AccurateTanh(s[n][e] * a.softcap_input_scale);
    }
  }
}

// -inf where a query row does not see a key. Rows of the tile are queries (kKeysAreRows false)
// or keys (true, the dK/dV pass); `row0` and `col0` are the sequence positions of the lane's
// first row and the tile's first column.
template <int kTiles, bool kKeysAreRows>
__device__ __forceinline__ void MaskScores(float (&s)[kTiles][4], const FwdArgs& a, int row0,
                                           int col0, int len_k, int offset) {
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
      const int diagonal = query + offset;
      const bool visible = key < len_k && key >= diagonal - a.window_left &&
                           key <= diagonal + a.window_right;
      if (!visible) s[n][e] = -CUDART_INF_F;
    }
  }
}

// Softcap, then masking where the tile crosses a mask edge (`masked`). The kernels with dropout
// and ALiBi call the two steps themselves, with the ALiBi bias in between.
template <int kTiles, bool kKeysAreRows>
__device__ __forceinline__ void ScoresToPre(float (&s)[kTiles][4], const FwdArgs& a, bool masked,
                                            int row0, int col0, int len_k, int offset) {
  SoftcapScores(s, a);
  if (!masked) return;
  MaskScores<kTiles, kKeysAreRows>(s, a, row0, col0, len_k, offset);
}

// Online softmax over one key tile: updates the running row maxima m and partial sums l (this
// lane's share; summed over the quad at the end), rescales o, and turns s into p.
template <int kTiles, int kOutTiles>
__device__ __forceinline__ void OnlineSoftmax(float (&s)[kTiles][4], float (&m)[2], float (&l)[2],
                                              float (&o)[kOutTiles][4], float exp2_scale) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    base[r] = mx[r] == -CUDART_INF_F ? 0.0f : mx[r] * exp2_scale;
    if (mx[r] != m[r]) {  // a new maximum (never the case for an all -inf tile)
      const float alpha = ptx::Exp2(m[r] * exp2_scale - base[r]);
      l[r] *= alpha;
#pragma unroll
      for (int d = 0; d < kOutTiles; ++d) {
        o[d][2 * r] *= alpha;
        o[d][2 * r + 1] *= alpha;
      }
      m[r] = mx[r];
    }
  }
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = ptx::Exp2(fmaf(s[n][e], exp2_scale, -base[e / 2]));
      l[e / 2] += s[n][e];
    }
  }
}

__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

}  // namespace attnserve::kernels::fallback
