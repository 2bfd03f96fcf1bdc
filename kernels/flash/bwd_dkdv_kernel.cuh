// FlashAttention-2's backward main loop for dK and dV with 16 keys per warp (Sm80 head dims 32
// and 96, every Turing head dim; head dims 64 and 128 on Sm80 use bwd_dkdv_pair_kernel.cuh): one
// CTA per (key block, kv head, sequence); 128 keys (8 warps) on Sm80, 64 (4 warps) on Sm75. K and V of the block stay in
// shared memory; for every query head of the kv head's group and every 64-row query block that
// sees a key of the block, Q, dO, lse and D stream through shared memory (two cp.async stages on
// Sm80, the next-but-one tile issued as soon as a tile is consumed, one barrier per tile; one
// register-staged stage on Sm75). Per query tile each warp, for its 16 keys:
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
#include "kernels/flash/bwd_cta_order.cuh"
#include "kernels/flash/bwd_mask_geometry.cuh"
#include "kernels/flash/bwd_traits.cuh"
#include "kernels/flash/bwd_warp_gemm.cuh"
#include "kernels/flash/extras_args.h"
#include "kernels/flash/extras_tile.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// dQ_accum[rows of the tile] += dS K for the 64 query rows of the tile: dS^T at `ds_smem`
// ([key][query], read transposed as the A operand) and the block's K (`k_frag`: a lane's
// ldmatrix.trans address into it). Warp w takes query rows 16 (w % 4) .. +15 and, with 8 warps,
// half of the columns (w / 4); k runs over all resident keys. Float atomics: v4 reductions on
// sm_90 (red.global.add.v4.f32 exists there only), v2 below.

template <typename T>
__device__ __forceinline__ void AccumulateDqAtomic(float* dq_accum, int64_t row_stride,
                                                   int rows_valid, int head_dim,
                                                   uint32_t ds_smem, uint32_t k_frag, int warp,
                                                   int lane) {
  using Arch = typename T::Arch;
  using Element = typename T::Element;
  constexpr int kColSplit = T::kWarps * T::kWarpRows / T::kStreamRows;  // 1 or 2
  constexpr int kColTiles = T::kDTiles / kColSplit;
  // One chunk per warp with 8 warps (at most 8 tiles, 32 accumulators), else 32 columns.
  constexpr int kChunkTiles = kColSplit == 2 ? kColTiles : 4;
  static_assert(kColTiles % kChunkTiles == 0 && kChunkTiles % 2 == 0, "whole tile pairs");
  const int warp_row = (warp % (T::kStreamRows / T::kWarpRows)) * T::kWarpRows;
  const int col_tile0 = (warp / (T::kStreamRows / T::kWarpRows)) * kColTiles;
  const int mat = lane / 8;
  const uint32_t a_frag = ds_smem + ((mat / 2) * 8 + lane % 8) * T::kDsRowBytes +
                          (warp_row + (mat % 2) * 8) * 2;
  const uint32_t b_frag = k_frag + col_tile0 * T::kMmaN * 2;
  const int group = lane / 4;
  const int quad_lane = lane % 4;
#pragma unroll
  for (int chunk = 0; chunk < kColTiles / kChunkTiles; ++chunk) {
    float acc[kChunkTiles][4];
#pragma unroll
    for (int t = 0; t < kChunkTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < T::kResidentRows / T::kMmaK; ++kk) {
      uint32_t a[4];
      ptx::LoadMatrixX4Trans(a, a_frag + kk * T::kMmaK * T::kDsRowBytes);
#pragma unroll
      for (int dp = 0; dp < kChunkTiles / 2; ++dp) {
        uint32_t b[4];
        ptx::LoadMatrixX4Trans(b, b_frag + kk * T::kMmaK * T::kSmemRowBytes +
                                      (chunk * kChunkTiles / 2 + dp) * 32);
        ptx::Mma16816<Arch, Element>(acc[2 * dp], a, b[0], b[1]);
        ptx::Mma16816<Arch, Element>(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
#if __CUDA_ARCH__ >= 900
    {
      // Lanes 2j and 2j+1 of a quad swap halves: the even one gets row `group`, columns
      // 4j..4j+3 of the 8-column tile, the odd one row group + 8: one v4 reduction each per
      // tile instead of two v2 (the reduction count, not bytes, limits L2 throughput).
      const bool odd = quad_lane & 1;
      const int row = warp_row + group + (odd ? 8 : 0);
      float* dst = dq_accum + row * row_stride;
#pragma unroll
      for (int t = 0; t < kChunkTiles; ++t) {
        const float y0 = __shfl_xor_sync(0xffffffffu, odd ? acc[t][0] : acc[t][2], 1);
        const float y1 = __shfl_xor_sync(0xffffffffu, odd ? acc[t][1] : acc[t][3], 1);
        const int col = (col_tile0 + chunk * kChunkTiles + t) * T::kMmaN + 4 * (quad_lane / 2);
        if (row < rows_valid && col < head_dim) {
          if (odd) {
            ptx::AtomicAddQuad(dst + col, y0, y1, acc[t][2], acc[t][3]);
          } else {
            ptx::AtomicAddQuad(dst + col, acc[t][0], acc[t][1], y0, y1);
          }
        }
      }
      continue;
    }
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row + group + 8 * h;
      if (row >= rows_valid) continue;
      float* dst = dq_accum + row * row_stride;
#pragma unroll
      for (int t = 0; t < kChunkTiles; ++t) {
        const int col = (col_tile0 + chunk * kChunkTiles + t) * T::kMmaN + 2 * quad_lane;
        if (col < head_dim) ptx::AtomicAddPair(dst + col, acc[t][2 * h], acc[t][2 * h + 1]);
      }
    }
  }
}

// One CTA's work; the kernel below is this, or a trap where the path's instructions don't exist.
// kExtras: dropout and ALiBi (NOTES.md "Dropout and ALiBi"), compiled in only where set.
template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kAtomicDq, bool kExtras>
__device__ __forceinline__ void FlashBackwardDkDvCta(const BwdArgsOf<kExtras>& args) {
  using T = BwdDkDvTraits<Arch, kDType, kHeadDim, kWide>;
  static_assert(T::kDsBuffers == T::kStages, "one dS^T tile per stage");
  using Element = typename T::Element;
  constexpr int kRowBytes = T::kSmemRowBytes;
  constexpr int kBlockN = T::kResidentRows;  // keys of the CTA
  constexpr int kBlockM = T::kStreamRows;    // queries of a streamed tile
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdKernelArgs& f = args.fwd;

  const DkDvCtaCoords cta = HeadsFirstDkDvCta(f);
  const int n_block = cta.n_block;
  const int kv_head = cta.kv_head;
  const int batch = cta.batch;
  const int k_begin = f.cu_seqlens_k[batch];
  const int len_k = f.cu_seqlens_k[batch + 1] - k_begin;
  const int key_first = n_block * kBlockN;
  if (key_first >= len_k) return;
  const int q_begin = f.cu_seqlens_q[batch];
  const int len_q = f.cu_seqlens_q[batch + 1] - q_begin;
  const int offset = len_k - len_q;  // query row i's diagonal key is i + offset

  // The query blocks whose rows see some key of the block.
  const int key_last = min(len_k, key_first + kBlockN) - 1;
  const QueryTiles tiles = QueryTilesOfKeyBlock<kBlockM>(f, key_first, key_last, len_q, offset);
  const int m_begin = tiles.begin;
  const int m_count = tiles.count;
  const int iters = m_count * f.head_group;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = lane / 4;
  const int quad_lane = lane % 4;
  const int vecs_valid = f.head_dim / T::kVecElems;
  const uint32_t k_smem = ptx::SharedAddress(smem);
  const uint32_t v_smem = k_smem + T::kResidentTileBytes;
  const uint32_t stage_smem = v_smem + T::kResidentTileBytes;
  const uint32_t ds_smem = stage_smem + T::kStages * T::kStageBytes;
  const FragOffsets frag = FragOffsets::For<kRowBytes>(lane);
  const uint32_t k_rows = k_smem + warp * T::kWarpRows * kRowBytes;  // this warp's 16 keys
  const uint32_t v_rows = v_smem + warp * T::kWarpRows * kRowBytes;

  const int64_t kv_offset = (int64_t{k_begin} + key_first) * f.kv_row_stride +
                            int64_t{kv_head} * f.head_dim;
  const int kv_stride = static_cast<int>(f.kv_row_stride);
  if (iters > 0) {
    LoadRowsAsync<Arch, kBlockN, T::kRowVecs, kRowBytes, T::kThreads>(
        k_smem, static_cast<const Element*>(f.k) + kv_offset, kv_stride, len_k - key_first,
        vecs_valid, tid);
    LoadRowsAsync<Arch, kBlockN, T::kRowVecs, kRowBytes, T::kThreads>(
        v_smem, static_cast<const Element*>(f.v) + kv_offset, kv_stride, len_k - key_first,
        vecs_valid, tid);
  }

  // Stage of iteration `it`: query block m of query head `head`; Q, dO, lse, D.
  auto load_stage = [&](int it) {
    const int head = kv_head * f.head_group + it / m_count;
    const int row0 = (m_begin + it % m_count) * kBlockM;
    const uint32_t st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const int64_t q_offset = (int64_t{q_begin} + row0) * f.q_row_stride +
                             int64_t{head} * f.head_dim;
    const int q_stride = static_cast<int>(f.q_row_stride);
    LoadRowsAsync<Arch, kBlockM, T::kRowVecs, kRowBytes, T::kThreads>(
        st, static_cast<const Element*>(f.q) + q_offset, q_stride, len_q - row0, vecs_valid,
        tid);
    LoadRowsAsync<Arch, kBlockM, T::kRowVecs, kRowBytes, T::kThreads>(
        st + T::kStreamTileBytes, static_cast<const Element*>(args.dout) + q_offset, q_stride,
        len_q - row0, vecs_valid, tid);
    // Threads 0-63 fetch lse, 64-127 D; rows past the sequence read 0 (their Q and dO are 0,
    // so they contribute exactly nothing).
    if (T::kThreads == 2 * kBlockM || tid < 2 * kBlockM) {
      const int row = row0 + tid % kBlockM;
      const float* src = tid < kBlockM ? f.lse : args.dsum;
      const int64_t index = int64_t{head} * f.total_q + q_begin + row;
      ptx::CopyAsync4<Arch>(st + 2 * T::kStreamTileBytes + tid * 4,
                            src + (row < len_q ? index : 0), row < len_q);
    }
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

  // Sm80: K, V and stage 0 in the first group, stage 1 in the second; each iteration's barrier
  // then finds the next stage landed (waited for just before it) and frees this one, which
  // right away starts loading the tile after next. Sm75: one stage, loaded at the top of each
  // iteration (the previous barrier freed it) and published by a second barrier.
  if constexpr (T::kStages == 2) {
    if (iters > 0) load_stage(0);
    ptx::CommitAsyncGroup<Arch>();
    if (iters > 1) load_stage(1);
    ptx::CommitAsyncGroup<Arch>();
    ptx::WaitAsyncGroups<Arch, 1>();
    __syncthreads();
  }
  const float exp2_scale = f.exp2_scale;
  const float lse2_scale = args.lse_log2_scale;
  const int my_key = key_first + warp * T::kWarpRows + group;  // rows my_key, my_key + 8
  const int warp_key_first = key_first + warp * T::kWarpRows;
  for (int it = 0; it < iters; ++it) {
    if constexpr (T::kStages == 1) {
      load_stage(it);  // the previous iteration's barrier freed the one stage
      __syncthreads();
    }

    const int row0 = (m_begin + it % m_count) * kBlockM;
    const uint32_t q_st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const uint32_t do_st = q_st + T::kStreamTileBytes;
    const float* lse_st =
        reinterpret_cast<const float*>(smem + (q_st - k_smem) + 2 * T::kStreamTileBytes);
    const float* d_st = lse_st + kBlockM;
    const uint32_t ds_tile = ds_smem + (it % T::kStages) * T::kDsBytes;

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
    // Extras: softcap's factor 1 - tanh^2 is kept aside, as s takes the ALiBi bias (a constant
    // shift of the score after softcap), and P / dS below follow the no-softcap code.
    float softcap_grad[kExtras ? T::kSTiles : 1][4];
    bool keep[kExtras ? T::kSTiles : 1][4];
    int x_head = 0;  // the tile's query head (extras)
    if constexpr (kExtras) {
      x_head = kv_head * f.head_group + it / m_count;
      if (f.softcap) SoftcapGradient(s, softcap_grad);
      if (args.x.alibi_slopes != nullptr) {
        AlibiColTile(s, AlibiSlopePre(args.x, batch, x_head), my_key,
                     row0 + 2 * quad_lane + offset);
      }
    }
    // Element-wise masking only where the warp's 16 x 64 tile crosses a mask edge or the end of
    // the keys (decided per warp: warp-uniform).
    const bool mask = warp_key_first + T::kWarpRows > len_k ||
                      warp_key_first + T::kWarpRows - 1 > row0 + offset + f.window_right ||
                      warp_key_first < row0 + kBlockM - 1 + offset - f.window_left;
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
    if (!f.softcap || kExtras) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
        const float2 lse = *reinterpret_cast<const float2*>(lse_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] = ptx::Exp2(fmaf(s[nt][e], exp2_scale, -(e % 2 ? lse.y : lse.x) * lse2_scale));
        }
      }
      bool dropped = false;
      if constexpr (kExtras) {
        if (args.x.dropout) {
          // dV += (P o keep)^T dO; the 1 / (1 - p) of kept entries is applied to dV at the end.
          DropoutKeepColTile(keep, args.x, args.x.first_sequence + batch, x_head, my_key,
                             row0 + 2 * quad_lane);
          float pz[T::kSTiles][4];
#pragma unroll
          for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) pz[nt][e] = keep[nt][e] ? s[nt][e] : 0.0f;
          }
          PackA<Element, T::kSTiles>(pa, pz);
          dropped = true;
        }
      }
      if (!dropped) PackA<Element, T::kSTiles>(pa, s);
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
        if constexpr (kExtras) {
          // dS = P o (dP o Z - D) [o (1 - tanh^2)], Z = keep / (1 - p).
          float dpz = dp[nt][e];
          if (args.x.dropout) dpz = keep[nt][e] ? dpz * args.x.dropout_scale : 0.0f;
          dp[nt][e] = s[nt][e] * (dpz - d);
          if (f.softcap) dp[nt][e] *= softcap_grad[nt][e];
        } else if (!f.softcap) {
          dp[nt][e] = s[nt][e] * (dp[nt][e] - d);
        } else {
          const float t = s[nt][e];  // -inf where masked: p = 0 and the factor clamps to 0
          const float p = ptx::Exp2(fmaf(t, exp2_scale, -(e % 2 ? lse.y : lse.x) * lse2_scale));
          dp[nt][e] = p * (dp[nt][e] - d) * (1.0f - fminf(t * t, 1.0f));
        }
      }
    }
    if constexpr (kAtomicDq) {
      // dS^T rows of this warp's keys into this stage's dS tile, for dQ = dS K below.
      const uint32_t ds_rows = ds_tile + (warp * T::kWarpRows + group) * T::kDsRowBytes;
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

    // One barrier: the dS tile is complete, every warp is done with this stage, and (Sm80) the
    // next stage, waited for here, is visible to all.
    if constexpr (T::kStages == 2) ptx::WaitAsyncGroups<Arch, 0>();
    __syncthreads();
    if constexpr (T::kStages == 2) {
      if (it + 2 < iters) load_stage(it + 2);  // into the stage just freed
      ptx::CommitAsyncGroup<Arch>();
    }
    if constexpr (kAtomicDq) {
      // dS tile `it % 2` is next written in iteration it + 2, after the barrier of it + 1,
      // which every warp reaches only after this product.
      const int head = kv_head * f.head_group + it / m_count;
      AccumulateDqAtomic<T>(
          args.dq_accum + (int64_t{q_begin} + row0) * f.q_row_stride + int64_t{head} * f.head_dim,
          f.q_row_stride, len_q - row0, f.head_dim, ds_tile, k_smem + frag.a, warp, lane);
    }
  }

  // Epilogue: each warp rounds its 16 rows of dK (times softmax_scale: d(score)/d(q.k)) and dV
  // into its own rows of the K and V buffers and stores them. The barrier: no copy into K/V
  // (issued by any thread) is still landing, and no warp still reads K in its dQ product.
  ptx::WaitAsyncGroups<Arch, 0>();
  __syncthreads();
  StoreAccumulator<Element, T::kDTiles, kRowBytes>(k_rows, dk, args.grad_scale, lane);
  float dv_scale = 1.0f;
  if constexpr (kExtras) dv_scale = args.x.dropout_scale;  // kept P's 1 / (1 - p)
  StoreAccumulator<Element, T::kDTiles, kRowBytes>(v_rows, dv, dv_scale, lane);
  __syncwarp();
  const int64_t out_offset = (int64_t{k_begin} + warp_key_first) * f.kv_row_stride +
                             int64_t{kv_head} * f.head_dim;
  StoreRows<T::kWarpRows, T::kRowVecs, kRowBytes, 32>(
      static_cast<Element*>(args.dk) + out_offset, f.kv_row_stride, k_rows,
      len_k - warp_key_first, vecs_valid, lane);
  StoreRows<T::kWarpRows, T::kRowVecs, kRowBytes, 32>(
      static_cast<Element*>(args.dv) + out_offset, f.kv_row_stride, v_rows,
      len_k - warp_key_first, vecs_valid, lane);
}

template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kAtomicDq, bool kExtras = false>
__global__ void __launch_bounds__(BwdDkDvTraits<Arch, kDType, kHeadDim, kWide>::kThreads)
    FlashBackwardDkDvKernel(const __grid_constant__ BwdArgsOf<kExtras> args) {
  if constexpr (kArchBodyCompiled<Arch>) {
    FlashBackwardDkDvCta<Arch, kDType, kHeadDim, kWide, kAtomicDq, kExtras>(args);
  } else {
    __trap();  // an sm80 kernel in an sm_75 binary: never launched there
  }
}

}  // namespace attnserve::kernels::flash
