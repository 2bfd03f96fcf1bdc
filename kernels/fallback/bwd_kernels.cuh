// The fallback backward, FlashAttention-2's algorithm without atomics (bitwise reproducible):
//   1. FallbackDsumKernel: D = rowsum(dO * O) in float32.
//   2. FallbackDkDvKernel: one CTA per (key block, kv head, sequence); each warp owns 16 keys
//      (and, above head dim 128, half of dK/dV's columns). K and V stay in shared memory; for
//      every query head of the GQA group and every query tile that sees a key of the block:
//      S^T = K Q^T, P^T = exp2(pre * c - lse * log2 e), dV += P^T dO, dP^T = V dO^T,
//      dS^T = P^T (dP^T - D) (1 - tanh^2 with softcap), dK += dS^T Q.
//   3. FallbackDqKernel: one CTA per (query block, head, sequence) in the forward's geometry:
//      S, P, dP = dO V^T and dS per key tile again, dQ += dS K in registers.
// kExtras (dropout, ALiBi; otherwise the same kernels): ALiBi joins pre after the softcap (the
// softcap derivative takes the tanh without it); with Z the scaled mask, dV += (P Z)^T dO and
// dS = P (dP Z - D), D being of the dropped output the forward returned.
#pragma once

#include <math_constants.h>

#include "kernels/fallback/fwd_kernel.cuh"

namespace attnserve::kernels::fallback {

inline constexpr float kLog2e = 1.4426950408889634f;

// One warp per (token, head): D[head, token] = sum over d of dO * O.
template <typename T>
__global__ void __launch_bounds__(256) FallbackDsumKernel(const BwdArgs a) {
  const int64_t item = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t total = a.fwd.total_q * a.fwd.num_heads;
  if (item >= total) return;
  const int64_t token = item / a.fwd.num_heads;
  const int head = static_cast<int>(item % a.fwd.num_heads);
  const int64_t base = token * a.fwd.q_row_stride + int64_t{head} * a.fwd.head_dim;
  const T* dout = static_cast<const T*>(a.dout) + base;
  const T* out = static_cast<const T*>(a.fwd.out) + base;
  float sum = 0.0f;
  for (int d = lane; d < a.fwd.head_dim; d += 32) sum += ToFloat(dout[d]) * ToFloat(out[d]);
#pragma unroll
  for (int s = 16; s >= 1; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (lane == 0) a.dsum[int64_t{head} * a.fwd.total_q + token] = sum;
}

// dS = P (dP - D) g with g = 1 - tanh^2 under softcap (0 where masked: pre = -inf, P = 0).
template <int kTiles>
__device__ __forceinline__ void ScoreGradient(float (&p)[kTiles][4], const float (&dp)[kTiles][4],
                                              const float (&pre)[kTiles][4], const float* dsum,
                                              bool softcap, bool dsum_per_column) {
  const int t = LaneId() % 4;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float dd = dsum_per_column ? dsum[n * 8 + 2 * t + (e % 2)] : dsum[e / 2];
      float ds = p[n][e] * (dp[n][e] - dd);
      if (softcap) ds *= fmaxf(1.0f - pre[n][e] * pre[n][e], 0.0f);
      p[n][e] = ds;
    }
  }
}

template <class Cfg, bool kExtras>
__global__ void __launch_bounds__(Cfg::kThreads)
    FallbackDkDvKernel(const BwdArgs ba, const ExtrasArgs x) {
  using T = typename Cfg::Element;
  constexpr Path P = Cfg::kPath;
  constexpr int D = Cfg::kDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStride;
  constexpr int C = Cfg::kColumns;
  constexpr bool kAsync = kAsyncCopy<P>;
  const FwdArgs& a = ba.fwd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + BN * S;
  const int warp = threadIdx.x / 32;
  const int group = warp / Cfg::kColSplit;
  const int col0 = (warp % Cfg::kColSplit) * C;
  float* scratch = reinterpret_cast<float*>(smem + Cfg::kResidentBytes + Cfg::kStreamedBytes +
                                            warp * Cfg::kScratchBytes);
  // Stage s of the streamed tiles: Q and dO rows, lse * log2(e) and D per query row.
  auto stage_q = [&](int stage) {
    return reinterpret_cast<T*>(smem + Cfg::kResidentBytes + stage * Cfg::kStageBytes);
  };
  auto stage_lse = [&](int stage) { return reinterpret_cast<float*>(stage_q(stage) + 2 * BM * S); };

  const int b = blockIdx.z, kv_head = blockIdx.y;
  const int k_begin = a.cu_seqlens_k[b];
  const int len_k = a.cu_seqlens_k[b + 1] - k_begin;
  const int n0 = blockIdx.x * BN;
  if (n0 >= len_k) return;
  const int q_begin = a.cu_seqlens_q[b];
  const int len_q = a.cu_seqlens_q[b + 1] - q_begin;
  const int keys = min(BN, len_k - n0);
  const int offset = len_k - len_q;
  // Query rows that see some key of the block: key j is seen by rows
  // [j - offset - window_right, j - offset + window_left].
  const int i_lo = max(0, n0 - offset - a.window_right);
  const int i_hi = min(len_q, n0 + keys - 1 - offset + a.window_left + 1);
  // The streamed tiles: every query head of the GQA group x every query tile in [i_lo, i_hi).
  const int m_tiles = i_lo < i_hi ? (i_hi - i_lo + BM - 1) / BM : 0;
  const int tiles = m_tiles * a.head_group;

  auto load_tile = [&](int it, int stage) {
    const int h = kv_head * a.head_group + it / m_tiles;
    const int m = i_lo + (it % m_tiles) * BM;
    const int64_t q_offset = (q_begin + m) * a.q_row_stride + int64_t{h} * a.head_dim;
    T* sQ = stage_q(stage);
    LoadTile<T, BM, D, S, Cfg::kThreads, kAsync>(sQ, static_cast<const T*>(a.q) + q_offset,
                                                 a.q_row_stride, len_q - m, a.head_dim,
                                                 a.vector_io);
    LoadTile<T, BM, D, S, Cfg::kThreads, kAsync>(sQ + BM * S,
                                                 static_cast<const T*>(ba.dout) + q_offset,
                                                 a.q_row_stride, len_q - m, a.head_dim,
                                                 a.vector_io);
    float* sLse = stage_lse(stage);
    const int64_t row0 = int64_t{h} * a.total_q + q_begin + m;
    for (int r = threadIdx.x; r < BM; r += Cfg::kThreads) {
      const bool valid = m + r < len_q;
      sLse[r] = valid ? a.lse[row0 + r] * kLog2e : CUDART_INF_F;  // +inf: P = 0
      sLse[BM + r] = valid ? ba.dsum[row0 + r] : 0.0f;
    }
  };

  const int64_t kv_offset = (k_begin + n0) * a.kv_row_stride + int64_t{kv_head} * a.head_dim;
  float dk[C / 8][4] = {};
  float dv[C / 8][4] = {};
  const int warp_key = n0 + group * 16;

  if (tiles > 0) {
    LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sK, static_cast<const T*>(a.k) + kv_offset,
                                                 a.kv_row_stride, keys, a.head_dim, a.vector_io);
    LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sV, static_cast<const T*>(a.v) + kv_offset,
                                                 a.kv_row_stride, keys, a.head_dim, a.vector_io);
    load_tile(0, 0);
  }
  for (int it = 0; it < tiles; ++it) {
    const int stage = it % Cfg::kStages;
    if (Cfg::kStages == 1 && it > 0) {
      __syncthreads();  // every warp is done with the previous tile
      load_tile(it, 0);
    }
    ptx::CommitAndWaitAll();
    __syncthreads();  // tile `it` visible; with two stages the other one is free again
    if (Cfg::kStages == 2 && it + 1 < tiles) load_tile(it + 1, stage ^ 1);
    const int m = i_lo + (it % m_tiles) * BM;
    const T* sQ = stage_q(stage);
    const T* sdO = sQ + BM * S;
    const float* sLse = stage_lse(stage);
    const float* sD = sLse + BM;

    float s[BM / 8][4] = {};
    GemmNT<P, T, BM, D>(s, sK + group * 16 * S, S, sQ, S, scratch);
    const bool masked = !AllVisible(a, m, m + BM - 1, n0, n0 + BN - 1, len_k, offset);
    float pre[BM / 8][4];
    const int t = LaneId() % 4;
    const int h = kv_head * a.head_group + it / m_tiles;  // the query head of this tile
    if constexpr (kExtras) {
      SoftcapScores(s, a);
#pragma unroll
      for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) pre[j][e] = s[j][e];  // finite where masked: P = 0 there
      }
      AddAlibi<BM / 8, true>(s, AlibiSlope(x, b, h), warp_key, m, offset);
      if (masked) MaskScores<BM / 8, true>(s, a, warp_key, m, len_k, offset);
    } else {
      ScoresToPre<BM / 8, true>(s, a, masked, warp_key, m, len_k, offset);
    }
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (!kExtras) pre[j][e] = s[j][e];
        s[j][e] = ptx::Exp2(fmaf(s[j][e], a.exp2_scale, -sLse[j * 8 + 2 * t + (e % 2)]));
      }
    }
    float dp[BM / 8][4] = {};
    GemmNT<P, T, BM, D>(dp, sV + group * 16 * S, S, sdO, S, scratch);
    if constexpr (kExtras) {
      float pz[BM / 8][4];  // P Z (P itself without dropout)
      if (x.dropout) {
        const uint32_t keep = DropoutKeepBits<BM / 8, true>(x, b, h, warp_key, m);
        ApplyDropout(pz, s, keep, x.dropout_scale);
        ApplyDropout(dp, dp, keep, x.dropout_scale);
      } else {
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) pz[j][e] = s[j][e];
        }
      }
      GemmNN<P, T, C, BM>(dv, pz, sdO + col0, S, scratch);
    } else {
      GemmNN<P, T, C, BM>(dv, s, sdO + col0, S, scratch);
    }
    ScoreGradient(s, dp, pre, sD, a.softcap, true);
    GemmNN<P, T, C, BM>(dk, s, sQ + col0, S, scratch);
  }
  T* dk_out = static_cast<T*>(ba.dk) + int64_t{k_begin} * a.kv_row_stride +
              int64_t{kv_head} * a.head_dim;
  T* dv_out = static_cast<T*>(ba.dv) + int64_t{k_begin} * a.kv_row_stride +
              int64_t{kv_head} * a.head_dim;
  StoreTile<T, C / 8>(dk_out, a.kv_row_stride, dk, warp_key, len_k, col0, a.head_dim,
                      ba.grad_scale, a.vector_io);
  StoreTile<T, C / 8>(dv_out, a.kv_row_stride, dv, warp_key, len_k, col0, a.head_dim, 1.0f,
                      a.vector_io);
}

template <class Cfg, bool kExtras>
__global__ void __launch_bounds__(Cfg::kThreads)
    FallbackDqKernel(const BwdArgs ba, const ExtrasArgs x) {
  using T = typename Cfg::Element;
  constexpr Path P = Cfg::kPath;
  constexpr int D = Cfg::kDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStride;
  constexpr bool kAsync = kAsyncCopy<P>;
  const FwdArgs& a = ba.fwd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + BM * S;
  auto stage_k = [&](int stage) {
    return reinterpret_cast<T*>(smem + Cfg::kResidentBytes + stage * Cfg::kStageBytes);
  };
  const int warp = threadIdx.x / 32;
  float* scratch = reinterpret_cast<float*>(smem + Cfg::kResidentBytes + Cfg::kStreamedBytes +
                                            warp * Cfg::kScratchBytes);

  const int b = blockIdx.z, head = blockIdx.y;
  const int q_begin = a.cu_seqlens_q[b];
  const int len_q = a.cu_seqlens_q[b + 1] - q_begin;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;
  if (m0 >= len_q) return;
  const int k_begin = a.cu_seqlens_k[b];
  const int len_k = a.cu_seqlens_k[b + 1] - k_begin;
  const int rows = min(BM, len_q - m0);
  const int offset = len_k - len_q;
  int n_lo, n_hi;
  VisibleKeys(a, m0, m0 + rows - 1, len_k, offset, n_lo, n_hi);
  float slope = 0.0f;
  if constexpr (kExtras) {
    if (n_lo < n_hi) n_lo &= ~1;  // even key tiles for the dropout mask, as in the forward
    slope = AlibiSlope(x, b, head);
  }
  const int tiles = n_lo < n_hi ? (n_hi - n_lo + BN - 1) / BN : 0;

  const int64_t q_offset = (q_begin + m0) * a.q_row_stride + int64_t{head} * a.head_dim;
  const int64_t kv_offset = k_begin * a.kv_row_stride + int64_t{head / a.head_group} * a.head_dim;
  const T* k = static_cast<const T*>(a.k) + kv_offset;
  const T* v = static_cast<const T*>(a.v) + kv_offset;
  auto load_tile = [&](int it, int stage) {
    const int n = n_lo + it * BN;
    T* sK = stage_k(stage);
    LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sK, k + n * a.kv_row_stride, a.kv_row_stride,
                                                 len_k - n, a.head_dim, a.vector_io);
    LoadTile<T, BN, D, S, Cfg::kThreads, kAsync>(sK + BN * S, v + n * a.kv_row_stride,
                                                 a.kv_row_stride, len_k - n, a.head_dim,
                                                 a.vector_io);
  };
  const int warp_row = m0 + warp * 16;
  const int lane = LaneId();
  float lse2[2], dsum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row + lane / 4 + 8 * r;
    const bool valid = row < len_q;
    const int64_t idx = int64_t{head} * a.total_q + q_begin + row;
    lse2[r] = valid ? a.lse[idx] * kLog2e : CUDART_INF_F;
    dsum[r] = valid ? ba.dsum[idx] : 0.0f;
  }

  float dq[D / 8][4] = {};
  if (tiles > 0) {
    LoadTile<T, BM, D, S, Cfg::kThreads, kAsync>(sQ, static_cast<const T*>(a.q) + q_offset,
                                                 a.q_row_stride, rows, a.head_dim, a.vector_io);
    LoadTile<T, BM, D, S, Cfg::kThreads, kAsync>(sdO, static_cast<const T*>(ba.dout) + q_offset,
                                                 a.q_row_stride, rows, a.head_dim, a.vector_io);
    load_tile(0, 0);
  }
  for (int it = 0; it < tiles; ++it) {
    const int stage = it % Cfg::kStages;
    if (Cfg::kStages == 1 && it > 0) {
      __syncthreads();  // every warp is done with the previous K/V tile
      load_tile(it, 0);
    }
    ptx::CommitAndWaitAll();
    __syncthreads();  // tile `it` visible; with two stages the other one is free again
    if (Cfg::kStages == 2 && it + 1 < tiles) load_tile(it + 1, stage ^ 1);
    const int n = n_lo + it * BN;
    const T* sK = stage_k(stage);
    const T* sV = sK + BN * S;
    float s[BN / 8][4] = {};
    GemmNT<P, T, BN, D>(s, sQ + warp * 16 * S, S, sK, S, scratch);
    const bool masked = !AllVisible(a, m0, m0 + BM - 1, n, n + BN - 1, len_k, offset);
    float pre[BN / 8][4];
    if constexpr (kExtras) {
      SoftcapScores(s, a);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) pre[j][e] = s[j][e];  // finite where masked: P = 0 there
      }
      AddAlibi<BN / 8, false>(s, slope, warp_row, n, offset);
      if (masked) MaskScores<BN / 8, false>(s, a, warp_row, n, len_k, offset);
    } else {
      ScoresToPre<BN / 8, false>(s, a, masked, warp_row, n, len_k, offset);
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (!kExtras) pre[j][e] = s[j][e];
        s[j][e] = ptx::Exp2(fmaf(s[j][e], a.exp2_scale, -lse2[e / 2]));
      }
    }
    float dp[BN / 8][4] = {};
    GemmNT<P, T, BN, D>(dp, sdO + warp * 16 * S, S, sV, S, scratch);
    if constexpr (kExtras) {
      if (x.dropout) {
        ApplyDropout(dp, dp, DropoutKeepBits<BN / 8, false>(x, b, head, warp_row, n),
                     x.dropout_scale);
      }
    }
    ScoreGradient(s, dp, pre, dsum, a.softcap, false);
    GemmNN<P, T, D, BN>(dq, s, sK, S, scratch);
  }
  T* dq_out = static_cast<T*>(ba.dq) + int64_t{q_begin} * a.q_row_stride +
              int64_t{head} * a.head_dim;
  StoreTile<T, D / 8>(dq_out, a.q_row_stride, dq, warp_row, len_q, 0, a.head_dim, ba.grad_scale,
                      a.vector_io);
}

}  // namespace attnserve::kernels::fallback
