// The fallback forward: one CTA per (query block of kBlockM rows, head, sequence); each warp owns
// 16 query rows. Q stays in shared memory; K and V tiles of kBlockN keys stream through one
// buffer each (on sm80+ paths V(n) loads under S = Q K(n)^T and K(n+1) under softmax and P V(n),
// through cp.async); S, P and O never leave registers (or the warp's scratch on kWmma / kSimt).
// Only key tiles some row of the block sees are visited; only tiles crossing a mask edge or the
// end of the keys are masked element-wise. kExtras adds ALiBi (to pre, before masking) and
// dropout (on P after the softmax statistics, so lse is of the undropped P; the 1 / (1 - p)
// scale joins the final normalization); without it the kernel is exactly the one without them.
#pragma once

#include <math_constants.h>

#include "kernels/fallback/extras.cuh"
#include "kernels/fallback/kernel_args.h"
#include "kernels/fallback/softmax.cuh"
#include "kernels/fallback/tile_config.cuh"
#include "kernels/fallback/tile_io.cuh"
#include "kernels/fallback/warp_tile.cuh"

namespace attnserve::kernels::fallback {

// Key range [lo, hi) that query rows [row_first, row_last] of a sequence see.
__device__ __forceinline__ void VisibleKeys(const FwdArgs& a, int row_first, int row_last,
                                            int len_k, int offset, int& lo, int& hi) {
  lo = max(0, row_first + offset - a.window_left);
  hi = min(len_k, row_last + offset + a.window_right + 1);
}

// Whether every (row, key) pair of rows [row_first, row_last] x keys [key_first, key_last] is
// visible (then the tile needs no element-wise mask).
__device__ __forceinline__ bool AllVisible(const FwdArgs& a, int row_first, int row_last,
                                           int key_first, int key_last, int len_k, int offset) {
  return key_last < len_k && key_first >= row_last + offset - a.window_left &&
         key_last <= row_first + offset + a.window_right;
}

template <class Cfg, bool kExtras>
__global__ void __launch_bounds__(Cfg::kThreads)
    FallbackForwardKernel(const FwdArgs a, const ExtrasArgs x) {
  using T = typename Cfg::Element;
  constexpr Path P = Cfg::kPath;
  constexpr int D = Cfg::kDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStride;
  constexpr bool kAsync = kAsyncCopy<P>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = reinterpret_cast<T*>(smem + Cfg::kResidentBytes);
  T* sV = sK + BN * S;
  const int warp = threadIdx.x / 32;
  float* scratch = reinterpret_cast<float*>(smem + Cfg::kResidentBytes + Cfg::kStreamedBytes +
                                            warp * Cfg::kScratchBytes);

  const int b = blockIdx.z, head = blockIdx.y;
  const int q_begin = a.cu_seqlens_q[b];
  const int len_q = a.cu_seqlens_q[b + 1] - q_begin;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // heaviest causal blocks first
  if (m0 >= len_q) return;
  const int k_begin = a.cu_seqlens_k[b];
  const int len_k = a.cu_seqlens_k[b + 1] - k_begin;
  const int rows = min(BM, len_q - m0);
  const int offset = len_k - len_q;
  int n_lo, n_hi;
  VisibleKeys(a, m0, m0 + rows - 1, len_k, offset, n_lo, n_hi);
  float slope = 0.0f;
  if constexpr (kExtras) {
    // Even key tiles: a lane's two keys 2t, 2t + 1 share one Philox call (extras.cuh); the
    // extra key in front is masked like any other it does not see.
    if (n_lo < n_hi) n_lo &= ~1;
    slope = AlibiSlope(x, b, head);
  }

  const T* q = static_cast<const T*>(a.q) + (q_begin + m0) * a.q_row_stride +
               int64_t{head} * a.head_dim;
  const int64_t kv_offset = k_begin * a.kv_row_stride + int64_t{head / a.head_group} * a.head_dim;
  const T* k = static_cast<const T*>(a.k) + kv_offset;
  const T* v = static_cast<const T*>(a.v) + kv_offset;

  float o[D / 8][4] = {};
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F};
  float l[2] = {0.0f, 0.0f};
  const int warp_row = m0 + warp * 16;  // sequence row of the warp's first row

  if (n_lo < n_hi) {
    LoadTile<T, BM, D, S, Cfg::kThreads, kAsync>(sQ, q, a.q_row_stride, rows, a.head_dim,
                                                 a.vector_io);
    LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sK, k + n_lo * a.kv_row_stride,
                                                 a.kv_row_stride, len_k - n_lo, a.head_dim,
                                                 a.vector_io);
    // Without cp.async, 16-byte tiles are staged through registers: V(n) is fetched before
    // S = Q K(n)^T and stored after it, K(n + 1) fetched before softmax and P V(n).
    const bool staged = !kAsync && a.vector_io;
    TileFetch<T, BN, D, S, Cfg::kThreads> fetch;
    for (int n = n_lo; n < n_hi; n += BN) {
      ptx::CommitAndWaitAll();
      __syncthreads();  // K(n) (and Q) visible; every warp is done with V(n - 1)
      if (staged) {
        fetch.Fetch(v + n * a.kv_row_stride, a.kv_row_stride, len_k - n, a.head_dim);
      } else {
        LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sV, v + n * a.kv_row_stride,
                                                     a.kv_row_stride, len_k - n, a.head_dim,
                                                     a.vector_io);
      }
      float s[BN / 8][4] = {};
      GemmNT<P, T, BN, D>(s, sQ + warp * 16 * S, S, sK, S, scratch);
      if (staged) fetch.Store(sV);
      ptx::CommitAndWaitAll();
      __syncthreads();  // V(n) visible; every warp is done with K(n)
      const bool more = n + BN < n_hi;
      if (more) {
        if (staged) {
          fetch.Fetch(k + (n + BN) * a.kv_row_stride, a.kv_row_stride, len_k - n - BN,
                      a.head_dim);
        } else {
          LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sK, k + (n + BN) * a.kv_row_stride,
                                                       a.kv_row_stride, len_k - n - BN,
                                                       a.head_dim, a.vector_io);
        }
      }
      const bool masked = !AllVisible(a, m0, m0 + BM - 1, n, n + BN - 1, len_k, offset);
      if constexpr (kExtras) {
        SoftcapScores(s, a);
        AddAlibi<BN / 8, false>(s, slope, warp_row, n, offset);
        if (masked) MaskScores<BN / 8, false>(s, a, warp_row, n, len_k, offset);
      } else {
        ScoresToPre<BN / 8, false>(s, a, masked, warp_row, n, len_k, offset);
      }
      OnlineSoftmax(s, m, l, o, a.exp2_scale);
      if constexpr (kExtras) {
        if (x.dropout) {  // dropped entries leave o; kept ones are scaled in the epilogue
          ApplyDropout(s, s, DropoutKeepBits<BN / 8, false>(x, b, head, warp_row, n), 1.0f);
        }
      }
      GemmNN<P, T, D, BN>(o, s, sV, S, scratch);
      if (staged && more) fetch.Store(sK);  // every warp finished reading K(n) before the barrier
    }
  }

  // Epilogue: normalize; rows that see no key get out = 0 and lse = +inf.
  const int lane = LaneId();
  float inv[2];
  float lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(l[r]);
    inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    lse[r] = sum > 0.0f ? m[r] * a.lse_scale + logf(sum) : CUDART_INF_F;
    if constexpr (kExtras) inv[r] *= x.dropout_scale;  // 1 without dropout
  }
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    o[d][0] *= inv[0];
    o[d][1] *= inv[0];
    o[d][2] *= inv[1];
    o[d][3] *= inv[1];
  }
  T* out = static_cast<T*>(a.out) + int64_t{q_begin} * a.q_row_stride + int64_t{head} * a.head_dim;
  StoreTile<T, D / 8>(out, a.q_row_stride, o, warp_row, len_q, 0, a.head_dim, 1.0f, a.vector_io);
  if (lane % 4 == 0) {
    float* lse_row = a.lse + int64_t{head} * a.total_q + q_begin;
    const int r0 = warp_row + lane / 4;
    if (r0 < len_q) lse_row[r0] = lse[0];
    if (r0 + 8 < len_q) lse_row[r0 + 8] = lse[1];
  }
}

}  // namespace attnserve::kernels::fallback
