// FlashAttention-2's backward main loop for dK and dV: one CTA per (key block, kv head,
// sequence). K and V of the block stay in shared memory; for every query head of the kv head's
// group and every query block that sees a key of the block, Q, dO, lse and D stream through
// shared memory (two cp.async stages on Sm80; one register-staged stage on Sm75). Per query
// tile each warp, for its 16 keys:
//   S^T = K Q^T,  P^T = exp2(S^T * c - lse * log2 e),  dV += P^T dO,
//   dP^T = V dO^T,  dS^T = P^T (dP^T - D) [(1 - tanh^2) with softcap],  dK += dS^T Q.
// dK and dV of the whole head group accumulate in fp32 registers (GQA needs no atomics), so they
// are deterministic. With kAtomicDq (non-deterministic mode, FlashAttention-2's scheme) the
// warps also round dS^T into shared memory and add dQ = dS K of the tile into a float32
// workspace with atomics; otherwise the separate dQ kernel (bwd_dq_kernel.cuh) computes dQ.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_traits.cuh"
#include "kernels/flash/bwd_warp_gemm.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// dQ_accum[rows of the tile] += dS K for this warp's 16 query rows of the tile at `ds_smem`
// (dS^T, [key][query], read transposed as the A operand) and the block's K (`k_frag`: a lane's
// ldmatrix.trans address into it), in
// 32-column chunks (16 accumulators at a time), with float atomics.
template <typename T>
__device__ __forceinline__ void AccumulateDqAtomic(float* dq_accum, int64_t row_stride,
                                                   int rows_valid, int head_dim,
                                                   uint32_t ds_smem, uint32_t k_frag, int warp,
                                                   int lane) {
  using Arch = typename T::Arch;
  using Element = typename T::Element;
  constexpr int kChunkTiles = 4;  // 32 columns
  const int mat = lane / 8;
  const uint32_t a_frag = ds_smem + ((mat / 2) * 8 + lane % 8) * T::kDsRowBytes +
                          (warp * T::kWarpRows + (mat % 2) * 8) * 2;
  const int group = lane / 4;
  const int quad_lane = lane % 4;
#pragma unroll
  for (int chunk = 0; chunk < T::kDTiles / kChunkTiles; ++chunk) {
    float acc[kChunkTiles][4];
#pragma unroll
    for (int t = 0; t < kChunkTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < T::kBlock / T::kMmaK; ++kk) {
      uint32_t a[4];
      ptx::LoadMatrixX4Trans(a, a_frag + kk * T::kMmaK * T::kDsRowBytes);
#pragma unroll
      for (int dp = 0; dp < kChunkTiles / 2; ++dp) {
        uint32_t b[4];
        ptx::LoadMatrixX4Trans(b, k_frag + kk * T::kMmaK * T::kSmemRowBytes +
                                      (chunk * kChunkTiles / 2 + dp) * 32);
        ptx::Mma16816<Arch, Element>(acc[2 * dp], a, b[0], b[1]);
        ptx::Mma16816<Arch, Element>(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * T::kWarpRows + group + 8 * h;
      if (row >= rows_valid) continue;
      float* dst = dq_accum + row * row_stride;
#pragma unroll
      for (int t = 0; t < kChunkTiles; ++t) {
        const int col = (chunk * kChunkTiles + t) * T::kMmaN + 2 * quad_lane;
        if (col < head_dim) ptx::AtomicAddPair(dst + col, acc[t][2 * h], acc[t][2 * h + 1]);
      }
    }
  }
}

// One CTA's work; the kernel below is this, or a trap where the path's instructions don't exist.
template <class Arch, DType kDType, int kHeadDim, bool kAtomicDq>
__device__ __forceinline__ void FlashBackwardDkDvCta(const BwdKernelArgs& args) {
  using T = BwdTraits<Arch, kDType, kHeadDim>;
  using Element = typename T::Element;
  constexpr int kRowBytes = T::kSmemRowBytes;
  constexpr int kBlock = T::kBlock;
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdKernelArgs& f = args.fwd;

  const int n_block = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const int k_begin = f.cu_seqlens_k[batch];
  const int len_k = f.cu_seqlens_k[batch + 1] - k_begin;
  const int key_first = n_block * kBlock;
  if (key_first >= len_k) return;
  const int q_begin = f.cu_seqlens_q[batch];
  const int len_q = f.cu_seqlens_q[batch + 1] - q_begin;
  const int offset = len_k - len_q;  // query row i's diagonal key is i + offset

  // Query rows that see some key of the block: [row_first, row_last], as query blocks.
  const int key_last = min(len_k, key_first + kBlock) - 1;
  const int row_first = max(0, key_first - f.window_right - offset);
  const int row_last = min(len_q - 1, key_last + f.window_left - offset);
  const int m_begin = row_first / kBlock;
  const int m_count = row_first > row_last ? 0 : row_last / kBlock - m_begin + 1;
  const int iters = m_count * f.head_group;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = lane / 4;
  const int quad_lane = lane % 4;
  const int vecs_valid = f.head_dim / T::kVecElems;
  const uint32_t k_smem = ptx::SharedAddress(smem);
  const uint32_t v_smem = k_smem + T::kTileBytes;
  const uint32_t stage_smem = v_smem + T::kTileBytes;
  const uint32_t ds_smem = stage_smem + T::kStages * T::kStageBytes;
  const FragOffsets frag = FragOffsets::For<kRowBytes>(lane);
  const uint32_t k_rows = k_smem + warp * T::kWarpRows * kRowBytes;  // this warp's 16 keys
  const uint32_t v_rows = v_smem + warp * T::kWarpRows * kRowBytes;

  const int64_t kv_offset = (int64_t{k_begin} + key_first) * f.kv_row_stride +
                            int64_t{kv_head} * f.head_dim;
  const int kv_stride = static_cast<int>(f.kv_row_stride);
  if (iters > 0) {
    LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
        k_smem, static_cast<const Element*>(f.k) + kv_offset, kv_stride, len_k - key_first,
        vecs_valid, tid);
    LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
        v_smem, static_cast<const Element*>(f.v) + kv_offset, kv_stride, len_k - key_first,
        vecs_valid, tid);
  }

  // Stage of iteration `it`: query block m of query head `head`; Q, dO, lse, D.
  auto load_stage = [&](int it) {
    const int head = kv_head * f.head_group + it / m_count;
    const int row0 = (m_begin + it % m_count) * kBlock;
    const uint32_t st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const int64_t q_offset = (int64_t{q_begin} + row0) * f.q_row_stride +
                             int64_t{head} * f.head_dim;
    const int q_stride = static_cast<int>(f.q_row_stride);
    LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
        st, static_cast<const Element*>(f.q) + q_offset, q_stride, len_q - row0, vecs_valid,
        tid);
    LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
        st + T::kTileBytes, static_cast<const Element*>(args.dout) + q_offset, q_stride,
        len_q - row0, vecs_valid, tid);
    // Threads 0-63 fetch lse, 64-127 D; rows past the sequence read 0 (their Q and dO are 0,
    // so they contribute exactly nothing).
    const int row = row0 + tid % kBlock;
    const float* src = tid < kBlock ? f.lse : args.dsum;
    const int64_t index = int64_t{head} * f.total_q + q_begin + row;
    ptx::CopyAsync4<Arch>(st + 2 * T::kTileBytes + tid * 4, src + (row < len_q ? index : 0),
                    row < len_q);
  };

  float dk[T::kDTiles][4];
  float dv[T::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < T::kDTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dk[dt][e] = 0.0f;
      dv[dt][e] = 0.0f;
    }
  }

  if constexpr (T::kStages == 2) {
    if (iters > 0) load_stage(0);
  }
  ptx::CommitAsyncGroup<Arch>();
  const float exp2_scale = f.exp2_scale;
  const float lse2_scale = args.lse_log2_scale;
  const int my_key = key_first + warp * T::kWarpRows + group;  // rows my_key, my_key + 8
  for (int it = 0; it < iters; ++it) {
    if constexpr (T::kStages == 2) {
      if (it + 1 < iters) load_stage(it + 1);
    } else {
      load_stage(it);  // the previous iteration's closing barrier freed the one stage
    }
    ptx::CommitAsyncGroup<Arch>();
    ptx::WaitAsyncGroups<Arch, 1>();
    __syncthreads();

    const int row0 = (m_begin + it % m_count) * kBlock;
    const uint32_t q_st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const uint32_t do_st = q_st + T::kTileBytes;
    const float* lse_st =
        reinterpret_cast<const float*>(smem + (q_st - k_smem) + 2 * T::kTileBytes);
    const float* d_st = lse_st + kBlock;

    // S^T = K Q^T (16 keys x 64 queries per warp).
    float s[T::kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
    WarpGemmABt<Arch, Element, T::kSTiles, kHeadDim / T::kMmaK, kRowBytes>(s, k_rows + frag.a,
                                                                    q_st + frag.b);
    if (f.softcap) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = ptx::Tanh(s[nt][e] * f.softcap_input_scale);
      }
    }
    // Element-wise masking only where the tile crosses a mask edge or the end of the keys.
    const bool mask = key_first + kBlock > len_k ||
                      key_first + kBlock - 1 > row0 + offset + f.window_right ||
                      key_first < row0 + kBlock - 1 + offset - f.window_left;
    if (mask) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = my_key + 8 * h;
        const int base = row0 + 2 * quad_lane;
        // Query column c (relative to base) sees the key iff lo <= c <= hi.
        const int lo = key - offset - f.window_right - base;
        const int hi = key < len_k ? key - offset + f.window_left - base : -1;
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = nt * T::kMmaN + e;
            if (c < lo || c > hi) s[nt][2 * h + e] = -INFINITY;
          }
        }
      }
    }

    // P^T (in place without softcap; with it s keeps tanh for the chain rule). dV += P^T dO.
    uint32_t pa[T::kSTiles / 2][4];
    if (!f.softcap) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
        const float2 lse = *reinterpret_cast<const float2*>(lse_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] = ptx::Exp2(fmaf(s[nt][e], exp2_scale, -(e % 2 ? lse.y : lse.x) * lse2_scale));
        }
      }
      PackA<Element, T::kSTiles>(pa, s);
    } else {
      float p[T::kSTiles][4];
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
        const float2 lse = *reinterpret_cast<const float2*>(lse_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[nt][e] = ptx::Exp2(fmaf(s[nt][e], exp2_scale, -(e % 2 ? lse.y : lse.x) * lse2_scale));
        }
      }
      PackA<Element, T::kSTiles>(pa, p);
    }
    WarpGemmAB<Arch, Element, T::kSTiles / 2, T::kDTiles, kRowBytes>(dv, pa, do_st + frag.a);

    // dP^T = V dO^T, then dS^T = P^T (dP^T - D) in place.
    float dp[T::kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] = 0.0f;
    }
    WarpGemmABt<Arch, Element, T::kSTiles, kHeadDim / T::kMmaK, kRowBytes>(dp, v_rows + frag.a,
                                                                    do_st + frag.b);
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
      const float2 dsum = *reinterpret_cast<const float2*>(d_st + nt * 8 + 2 * quad_lane);
      const float2 lse = *reinterpret_cast<const float2*>(lse_st + nt * 8 + 2 * quad_lane);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = e % 2 ? dsum.y : dsum.x;
        if (!f.softcap) {
          dp[nt][e] = s[nt][e] * (dp[nt][e] - d);
        } else {
          const float t = s[nt][e];  // -inf where masked: p = 0 and the factor clamps to 0
          const float p = ptx::Exp2(fmaf(t, exp2_scale, -(e % 2 ? lse.y : lse.x) * lse2_scale));
          dp[nt][e] = p * (dp[nt][e] - d) * (1.0f - fminf(t * t, 1.0f));
        }
      }
    }
    if constexpr (kAtomicDq) {
      // dS^T rows of this warp's keys into the shared dS tile, for dQ = dS K below.
      const uint32_t ds_rows = ds_smem + (warp * T::kWarpRows + group) * T::kDsRowBytes;
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ptx::StoreShared32(ds_rows + 8 * h * T::kDsRowBytes + (nt * 8 + 2 * quad_lane) * 2,
                             ptx::PackPair<Element>(dp[nt][2 * h], dp[nt][2 * h + 1]));
        }
      }
    }
    PackA<Element, T::kSTiles>(pa, dp);
    WarpGemmAB<Arch, Element, T::kSTiles / 2, T::kDTiles, kRowBytes>(dk, pa, q_st + frag.a);
    if constexpr (kAtomicDq) {
      __syncthreads();  // the dS tile is complete
      const int head = kv_head * f.head_group + it / m_count;
      AccumulateDqAtomic<T>(
          args.dq_accum + (int64_t{q_begin} + row0) * f.q_row_stride + int64_t{head} * f.head_dim,
          f.q_row_stride, len_q - row0, f.head_dim, ds_smem, k_smem + frag.a, warp, lane);
    }
    __syncthreads();  // every warp is done with this stage (and dS) before they are refilled
  }

  // Epilogue: each warp rounds its 16 rows of dK (times softmax_scale: d(score)/d(q.k)) and dV
  // into its own rows of the K and V buffers (only it ever read them) and stores them.
  ptx::WaitAsyncGroups<Arch, 0>();
  __syncthreads();  // no copy into K/V (issued by any thread) is still landing
  StoreAccumulator<Element, T::kDTiles, kRowBytes>(k_rows, dk, args.grad_scale, lane);
  StoreAccumulator<Element, T::kDTiles, kRowBytes>(v_rows, dv, 1.0f, lane);
  __syncwarp();
  const int warp_key = key_first + warp * T::kWarpRows;
  const int64_t out_offset = (int64_t{k_begin} + warp_key) * f.kv_row_stride +
                             int64_t{kv_head} * f.head_dim;
  StoreRows<T::kWarpRows, T::kRowVecs, kRowBytes, 32>(
      static_cast<Element*>(args.dk) + out_offset, f.kv_row_stride, k_rows, len_k - warp_key,
      vecs_valid, lane);
  StoreRows<T::kWarpRows, T::kRowVecs, kRowBytes, 32>(
      static_cast<Element*>(args.dv) + out_offset, f.kv_row_stride, v_rows, len_k - warp_key,
      vecs_valid, lane);
}

template <class Arch, DType kDType, int kHeadDim, bool kAtomicDq>
__global__ void __launch_bounds__(BwdTraits<Arch, kDType, kHeadDim>::kThreads)
    FlashBackwardDkDvKernel(const __grid_constant__ BwdKernelArgs args) {
  if constexpr (kArchBodyCompiled<Arch>) {
    FlashBackwardDkDvCta<Arch, kDType, kHeadDim, kAtomicDq>(args);
  } else {
    __trap();  // an sm80 kernel in an sm_75 binary: never launched there
  }
}

}  // namespace attnserve::kernels::flash
