// The element-wise math of the forward on one 16-row tile of S (and O) held in the mma
// accumulator layout, shared by the sm80/sm75 kernel (mma.sync m16n8) and the Hopper kernel
// (wgmma m64, whose accumulator is the same layout per warp): each thread holds rows
// group = lane / 4 and group + 8 (index h = 0, 1) and, of each 8-column tile nt, columns
// 2 (lane % 4) + {0, 1}, as elements [nt][2 h + {0, 1}]. A row is spread over the 4 lanes of a
// quad, so row reductions end with two shuffles.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// Hides the keys each row must not see (past the end of the keys, outside the window) with
// -inf. `aligned` is the key on row group's diagonal; `first_col` the key of this thread's
// first column. Bounds are taken relative to first_col so that the compares are against
// immediates.
template <int kSTiles>
__device__ __forceinline__ void MaskRowTile(float (&s)[kSTiles][4], int aligned, int first_col,
                                            int len_k, const FwdKernelArgs& args) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int last = min(aligned + 8 * h + args.window_right, len_k - 1) - first_col;
    const int first = aligned + 8 * h - args.window_left - first_col;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = nt * 8 + e;
        if (col > last || col < first) s[nt][2 * h + e] = -INFINITY;
      }
    }
  }
}

// First half of the online softmax for one tile: the new row maxima (over the quad), the
// exp2-domain shift each row's scores are taken against, and the factor by which the row's
// running sum and O must be rescaled. Whether some row of this thread has a new maximum is
// or-ed into any_new_max.
template <int kSTiles>
__device__ __forceinline__ void UpdateRowMax(const float (&s)[kSTiles][4], float (&row_max)[2],
                                             float scale, float (&shift)[2],
                                             float (&correction)[2], bool& any_new_max) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = row_max[h];
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    any_new_max |= mx != row_max[h];
    // A row with nothing visible so far keeps max -inf; subtract 0 instead so that
    // exp2(-inf - (-inf)) never turns into NaN.
    shift[h] = mx == -INFINITY ? 0.0f : mx * scale;
    correction[h] = ptx::Exp2(row_max[h] * scale - shift[h]);
    row_max[h] = mx;
  }
}

// Second half: turns S into unnormalized probabilities exp2(s * scale - shift) in place and
// rescales the running row sums before adding this tile's.
template <int kSTiles>
__device__ __forceinline__ void ExponentiateRows(float (&s)[kSTiles][4], const float (&shift)[2],
                                                 const float (&correction)[2], float scale,
                                                 float (&row_sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = ptx::Exp2(fmaf(s[nt][2 * h + e], scale, -shift[h]));
        s[nt][2 * h + e] = p;
        sum += p;
      }
    }
    row_sum[h] = row_sum[h] * correction[h] + sum;
  }
}

// P's k16 step kk as 16-bit pairs: the accumulator layout of two 8-key tiles is the A fragment
// of one m16k16 step.
template <typename Element, int kSTiles>
__device__ __forceinline__ void PackPStep(const float (&p)[kSTiles][4], int kk,
                                          uint32_t (&a)[4]) {
  a[0] = ptx::PackPair<Element>(p[2 * kk][0], p[2 * kk][1]);
  a[1] = ptx::PackPair<Element>(p[2 * kk][2], p[2 * kk][3]);
  a[2] = ptx::PackPair<Element>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = ptx::PackPair<Element>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// A row's total of its quad's partial sums of probabilities.
__device__ __forceinline__ float QuadRowSum(float partial) {
  partial += __shfl_xor_sync(0xffffffffu, partial, 1);
  return partial + __shfl_xor_sync(0xffffffffu, partial, 2);
}

// What O's row is multiplied by: 1 / sum, or 0 for a row that saw no key (sum 0; NaN inputs
// stay NaN).
__device__ __forceinline__ float RowNormalizer(float sum) { return sum == 0.0f ? 0.0f : 1.0f / sum; }

// The row's log-sum-exp in natural log from its maximum and sum: +inf for a row that saw no key.
__device__ __forceinline__ float RowLse(float sum, float row_max, float lse_scale) {
  return sum == 0.0f ? INFINITY : row_max * lse_scale + logf(sum);
}

}  // namespace attnserve::kernels::flash
