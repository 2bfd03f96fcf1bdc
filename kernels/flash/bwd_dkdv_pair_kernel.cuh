// The dK/dV kernel in FlashAttention-2's warp layout (Sm80, head dims 64, 128, 192, 256): one
// CTA per (N-key block, kv head, sequence), 8 warps; query tiles of M rows (Q, dO, lse, D) stream
// through two cp.async stages (one in the narrow variant at 192/256). N x M = 128 x 128 at head
// dim 64, 128 x 64 at 128, 64 x 64 at 192/256. With P = 8 / (N / 32) warps per 32 keys, warp w
// owns keys 32 (w / P) .. +31 and, per phase:
//   A (scores):   S^T and dP^T for its 32 keys x query part w % P (32 x M/P tiles), then P^T
//                 and dS^T = P^T (dP^T - D) [(1 - tanh^2) with softcap] rounded into shared
//                 memory ([key][query] tiles);
//   C (products): dV += P^T dO and dK += dS^T Q for its 32 keys x head-dim part w % P (dK + dV:
//                 2 x 32 x d / P floats per warp, 128 at head dims 128 and 256), and (atomic
//                 mode) dQ = dS K for 32 query rows x 1/(8 / (M/32)) of the head dim, added to
//                 the float32 workspace with v4 reductions.
// Against 16 keys x 64 queries per warp (bwd_dkdv_kernel.cuh) every fragment read from shared
// memory feeds two to four times the products (ldmatrix wavefronts were what limited it: nsight
// compute showed both it and FlashAttention-2 at ~69% of L1 throughput, ours moving 1.4x the
// wavefronts per flop). Two barriers per tile: after phase A (P^T and dS^T complete) and before
// the next tile's phase A (this tile's stage and P^T / dS^T free; the next stage, issued right
// after it, lands under A and C). With one stage a third barrier waits for the tile's loads.
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

// kExtras: dropout and ALiBi (NOTES.md "Dropout and ALiBi"), compiled in only where set.
template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kAtomicDq, bool kExtras>
__device__ __forceinline__ void FlashBackwardDkDvPairCta(const BwdArgsOf<kExtras>& args) {
  using T = BwdDkDvTraits<Arch, kDType, kHeadDim, kWide>;
  using Element = typename T::Element;
  constexpr int kRowBytes = T::kSmemRowBytes;
  constexpr int kDsRowBytes = T::kDsRowBytes;
  constexpr int kBlockN = T::kResidentRows;  // 64 or 128 keys
  constexpr int kBlockM = T::kStreamRows;    // 64 or 128 queries
  static_assert(T::kWarps == 8 && (kBlockN == 64 || kBlockN == 128) &&
                    (kBlockM == 64 || kBlockM == 128),
                "8 warps, 128 x 64, 128 x 128 or 64 x 64 tiles");
  static_assert(T::kDsBuffers == 2, "P^T and dS^T tiles");
  constexpr int kKeyTiles = 2;                    // 32 keys per warp
  constexpr int kParts = 8 / (kBlockN / 32);      // warps sharing 32 keys
  // Phase A: every warp computes both S^T and dP^T for its 32 keys x kAWarpM queries. (At
  // 64-key blocks, splitting S^T and dP^T across warps measured no faster and rounds G once
  // more.)
  constexpr int kAWarpM = kBlockM / kParts;  // queries per warp (phase A)
  constexpr int kAQTiles = kAWarpM / 8;
  constexpr int kDPartTiles = T::kDTiles / kParts;  // head-dim part (phase C)
  constexpr int kDqRowParts = kBlockM / 32;       // dQ: 32 query rows x 1 / (8 / parts) of d
  constexpr int kDqColTiles = T::kDTiles * kDqRowParts / 8;
  // dQ columns per pass: at most 32 accumulators beside dK and dV where that divides evenly (at
  // head dim 256: 64 spill); at 192 all 6 tiles at once, but 2 per pass with one stage (6 spill
  // there).
  constexpr int kDqChunkTiles =
      kDqColTiles % 4 == 0 ? 4 : (T::kStages == 2 ? kDqColTiles : 2);
  static_assert(kAQTiles % 2 == 0 && kDPartTiles % 2 == 0 && kDqChunkTiles % 2 == 0,
                "pairs of 8-column tiles per warp");
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
  const int key_part = warp / kParts;  // keys 32 key_part .. +31 (C)
  const int part = warp % kParts;      // head-dim part (C)
  const int vecs_valid = f.head_dim / T::kVecElems;
  const uint32_t k_smem = ptx::SharedAddress(smem);
  const uint32_t v_smem = k_smem + T::kResidentTileBytes;
  const uint32_t stage_smem = v_smem + T::kResidentTileBytes;
  const uint32_t p_smem = stage_smem + T::kStages * T::kStageBytes;  // P^T [key][query]
  const uint32_t ds_smem = p_smem + T::kDsBytes;                     // dS^T [key][query]
  const FragOffsets frag = FragOffsets::For<kRowBytes>(lane);
  const FragOffsets frag_ds = FragOffsets::For<kDsRowBytes>(lane);
  const int warp_key_first = key_first + key_part * 32;
  const uint32_t k_rows = k_smem + key_part * 32 * kRowBytes;
  const uint32_t v_rows = v_smem + key_part * 32 * kRowBytes;

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
    if (tid < 2 * kBlockM) {
      const int row = row0 + tid % kBlockM;
      const float* src = tid < kBlockM ? f.lse : args.dsum;
      const int64_t index = int64_t{head} * f.total_q + q_begin + row;
      ptx::CopyAsync4<Arch>(st + 2 * T::kStreamTileBytes + tid * 4,
                            src + (row < len_q ? index : 0), row < len_q);
    }
  };

  float dk[kKeyTiles][kDPartTiles][4];
  float dv[kKeyTiles][kDPartTiles][4];
#pragma unroll
  for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDPartTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk[mt][dt][e] = 0.0f;
        dv[mt][dt][e] = 0.0f;
      }
    }
  }

  if (iters > 0) load_stage(0);
  ptx::CommitAsyncGroup<Arch>();
  const float exp2_scale = f.exp2_scale;
  const float lse2_scale = args.lse_log2_scale;
  for (int it = 0; it < iters; ++it) {
    if constexpr (T::kStages == 2) {
      // Stage `it` (and K, V) landed for this thread; the barrier publishes it and frees the
      // other stage and the P^T / dS^T tiles (every warp finished the previous tile's phase C).
      ptx::WaitAsyncGroups<Arch, 0>();
      __syncthreads();
      if (it + 1 < iters) load_stage(it + 1);
      ptx::CommitAsyncGroup<Arch>();
    } else {
      // One stage: once every warp finished the previous tile's phase C (barrier), tile `it`
      // goes into the stage; the second barrier publishes it.
      if (it > 0) {
        __syncthreads();
        load_stage(it);
        ptx::CommitAsyncGroup<Arch>();
      }
      ptx::WaitAsyncGroups<Arch, 0>();
      __syncthreads();
    }

    const int row0 = (m_begin + it % m_count) * kBlockM;
    const uint32_t q_st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const uint32_t do_st = q_st + T::kStreamTileBytes;
    const float* lse_st =
        reinterpret_cast<const float*>(smem + (q_st - k_smem) + 2 * T::kStreamTileBytes) +
        part * kAWarpM;
    const float* d_st = lse_st + kBlockM;

    const uint32_t key_rows_ds = (key_part * 32) * kDsRowBytes + frag_ds.a;
    const uint32_t d_cols = part * kDPartTiles * T::kMmaN * 2;
    auto accumulate_dv = [&] {
      WarpGemmSmemAB<Arch, Element, kKeyTiles, kDPartTiles, kBlockM / T::kMmaK, kDsRowBytes,
                     kRowBytes, false>(dv, p_smem + key_rows_ds, do_st + frag.a + d_cols);
    };
    auto accumulate_dk = [&] {
      WarpGemmSmemAB<Arch, Element, kKeyTiles, kDPartTiles, kBlockM / T::kMmaK, kDsRowBytes,
                     kRowBytes, false>(dk, ds_smem + key_rows_ds, q_st + frag.a + d_cols);
    };
    // Phase A. S^T = K Q^T for 32 keys x kAWarpM queries.
    float s[kKeyTiles][kAQTiles][4];
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kAQTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      }
    }
    WarpGemmABtM<Arch, Element, kKeyTiles, kAQTiles, kHeadDim / T::kMmaK, kRowBytes, kRowBytes>(
        s, k_rows + frag.a, q_st + part * kAWarpM * kRowBytes + frag.b);
    if (f.softcap) {
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kAQTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nt][e] = ptx::Tanh(s[mt][nt][e] * f.softcap_input_scale);
          }
        }
      }
    }
    const int q_first = row0 + part * kAWarpM;
    // Extras: softcap's factor 1 - tanh^2 is kept aside, as s takes the ALiBi bias (a constant
    // shift of the score after softcap), and P / dS below follow the no-softcap code.
    float softcap_grad[kExtras ? kKeyTiles : 1][kExtras ? kAQTiles : 1][4];
    bool keep[kExtras ? kKeyTiles : 1][kExtras ? kAQTiles : 1][4];
    int x_head = 0;  // the tile's query head (extras)
    if constexpr (kExtras) {
      x_head = kv_head * f.head_group + it / m_count;
      if (f.softcap) {
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) SoftcapGradient(s[mt], softcap_grad[mt]);
      }
      if (args.x.alibi_slopes != nullptr) {
        const float slope = AlibiSlopePre(args.x, batch, x_head);
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
          AlibiColTile(s[mt], slope, warp_key_first + mt * 16 + group,
                       q_first + 2 * quad_lane + offset);
        }
      }
    }
    // Element-wise masking only where the warp's 32 x kAWarpM tile crosses a mask edge or the
    // end of the keys (warp-uniform).
    const bool mask = warp_key_first + 32 > len_k ||
                      warp_key_first + 31 > q_first + offset + f.window_right ||
                      warp_key_first < q_first + kAWarpM - 1 + offset - f.window_left;
    if (mask) {
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = warp_key_first + mt * 16 + group + 8 * h;
          const int base = q_first + 2 * quad_lane;
          const int lo = key - offset - f.window_right - base;
          const int hi = key < len_k ? key - offset + f.window_left - base : -1;
#pragma unroll
          for (int nt = 0; nt < kAQTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int c = nt * T::kMmaN + e;
              if (c < lo || c > hi) s[mt][nt][2 * h + e] = -INFINITY;
            }
          }
        }
      }
    }
    // P^T = exp2(S^T c - lse log2 e): in place without softcap; with it s keeps tanh for the
    // chain rule and P^T is recomputed for dS^T. Rounded into the P^T tile.
    const uint32_t pt_offset =
        (key_part * 32 + group) * kDsRowBytes + (part * kAWarpM + 2 * quad_lane) * 2;
    auto store_tile = [&](uint32_t tile, const float (&x)[kKeyTiles][kAQTiles][4]) {
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kAQTiles; ++nt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            ptx::StoreShared32(tile + pt_offset + (mt * 16 + 8 * h) * kDsRowBytes + nt * 16,
                               ptx::PackPair<Element>(x[mt][nt][2 * h], x[mt][nt][2 * h + 1]));
          }
        }
      }
    };
    auto exp_tile = [&](float (&out)[kKeyTiles][kAQTiles][4],
                        const float (&in)[kKeyTiles][kAQTiles][4]) {
#pragma unroll
      for (int nt = 0; nt < kAQTiles; ++nt) {
        const float2 lse = *reinterpret_cast<const float2*>(lse_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            out[mt][nt][e] = ptx::Exp2(
                fmaf(in[mt][nt][e], exp2_scale, -(e % 2 ? lse.y : lse.x) * lse2_scale));
          }
        }
      }
    };
    if constexpr (kExtras) {
      exp_tile(s, s);
      if (args.x.dropout) {
        // The P^T tile feeds dV = (P o keep)^T dO; kept P's 1 / (1 - p) is applied to dV at the
        // end.
        float pz[kKeyTiles][kAQTiles][4];
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
          DropoutKeepColTile(keep[mt], args.x, args.x.first_sequence + batch, x_head,
                             warp_key_first + mt * 16 + group, q_first + 2 * quad_lane);
#pragma unroll
          for (int nt = 0; nt < kAQTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) pz[mt][nt][e] = keep[mt][nt][e] ? s[mt][nt][e] : 0.0f;
          }
        }
        store_tile(p_smem, pz);
      } else {
        store_tile(p_smem, s);
      }
    } else if (!f.softcap) {
      exp_tile(s, s);
      store_tile(p_smem, s);
    } else {
      float p[kKeyTiles][kAQTiles][4];
      exp_tile(p, s);
      store_tile(p_smem, p);
    }

    // dP^T = V dO^T, dS^T = P^T (dP^T - D) into the dS^T tile.
    float dp[kKeyTiles][kAQTiles][4];
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kAQTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[mt][nt][e] = 0.0f;
      }
    }
    WarpGemmABtM<Arch, Element, kKeyTiles, kAQTiles, kHeadDim / T::kMmaK, kRowBytes, kRowBytes>(
        dp, v_rows + frag.a, do_st + part * kAWarpM * kRowBytes + frag.b);
    if constexpr (kExtras) {
      // dS^T = P^T o (dP^T o Z - D) [o (1 - tanh^2)], Z = keep / (1 - p).
#pragma unroll
      for (int nt = 0; nt < kAQTiles; ++nt) {
        const float2 dsum = *reinterpret_cast<const float2*>(d_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float dpz = dp[mt][nt][e];
            if (args.x.dropout) dpz = keep[mt][nt][e] ? dpz * args.x.dropout_scale : 0.0f;
            dp[mt][nt][e] = s[mt][nt][e] * (dpz - (e % 2 ? dsum.y : dsum.x));
            if (f.softcap) dp[mt][nt][e] *= softcap_grad[mt][nt][e];
          }
        }
      }
    } else if (!f.softcap) {
#pragma unroll
      for (int nt = 0; nt < kAQTiles; ++nt) {
        const float2 dsum = *reinterpret_cast<const float2*>(d_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dp[mt][nt][e] = s[mt][nt][e] * (dp[mt][nt][e] - (e % 2 ? dsum.y : dsum.x));
          }
        }
      }
    } else {
      float p[kKeyTiles][kAQTiles][4];
      exp_tile(p, s);
#pragma unroll
      for (int nt = 0; nt < kAQTiles; ++nt) {
        const float2 dsum = *reinterpret_cast<const float2*>(d_st + nt * 8 + 2 * quad_lane);
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float t = s[mt][nt][e];  // -inf where masked: p = 0, the factor clamps to 0
            dp[mt][nt][e] = p[mt][nt][e] * (dp[mt][nt][e] - (e % 2 ? dsum.y : dsum.x)) *
                            (1.0f - fminf(t * t, 1.0f));
          }
        }
      }
    }
    store_tile(ds_smem, dp);
    __syncthreads();  // P^T and dS^T of the tile are complete
    // Phase C. dV += P^T dO, dK += dS^T Q for 32 keys x head-dim part.
    accumulate_dv();
    accumulate_dk();
    if constexpr (kAtomicDq) {
      // dQ = dS K: query rows 32 (w % parts) .. +31, column part w / parts; dS read transposed.
      const int dq_row0 = (warp % kDqRowParts) * 32;
      const int mat = lane / 8;
      const uint32_t a_frag = ds_smem + ((mat / 2) * 8 + lane % 8) * kDsRowBytes +
                              (dq_row0 + (mat % 2) * 8) * 2;
      const int head = kv_head * f.head_group + it / m_count;
      float* dq = args.dq_accum + (int64_t{q_begin} + row0) * f.q_row_stride +
                  int64_t{head} * f.head_dim;
      const int rows_valid = len_q - row0;
      const bool odd = quad_lane & 1;
#pragma unroll 1
      for (int chunk = 0; chunk < kDqColTiles / kDqChunkTiles; ++chunk) {
        float acc[2][kDqChunkTiles][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int t = 0; t < kDqChunkTiles; ++t) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][t][e] = 0.0f;
          }
        }
        const int col0 = ((warp / kDqRowParts) * kDqColTiles + chunk * kDqChunkTiles) * T::kMmaN;
        WarpGemmSmemAB<Arch, Element, 2, kDqChunkTiles, kBlockN / T::kMmaK, kDsRowBytes,
                       kRowBytes, true>(acc, a_frag, k_smem + frag.a + col0 * 2);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const int row = dq_row0 + mt * 16 + group + (odd ? 8 : 0);
          float* dst = dq + row * f.q_row_stride;
#pragma unroll
          for (int t = 0; t < kDqChunkTiles; ++t) {
            // Lanes 2j, 2j+1 of a quad swap halves: one v4 reduction each per 8-column tile.
            const float y0 =
                __shfl_xor_sync(0xffffffffu, odd ? acc[mt][t][0] : acc[mt][t][2], 1);
            const float y1 =
                __shfl_xor_sync(0xffffffffu, odd ? acc[mt][t][1] : acc[mt][t][3], 1);
            const int col = col0 + t * T::kMmaN + 4 * (quad_lane / 2);
            if (row < rows_valid && col < f.head_dim) {
              if (odd) {
                ptx::AtomicAddQuad(dst + col, y0, y1, acc[mt][t][2], acc[mt][t][3]);
              } else {
                ptx::AtomicAddQuad(dst + col, acc[mt][t][0], acc[mt][t][1], y0, y1);
              }
            }
          }
        }
      }
    }
  }

  // Epilogue: every warp is done reading K and V (barrier), rounds its dK (times
  // softmax_scale) and dV quarter-blocks into the K and V buffers, and all threads store them.
  ptx::WaitAsyncGroups<Arch, 0>();
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kKeyTiles; ++mt) {
    const uint32_t offset_bytes =
        (key_part * 32 + mt * 16) * kRowBytes + part * kDPartTiles * T::kMmaN * 2;
    StoreAccumulator<Element, kDPartTiles, kRowBytes>(k_smem + offset_bytes, dk[mt],
                                                      args.grad_scale, lane);
    float dv_scale = 1.0f;
    if constexpr (kExtras) dv_scale = args.x.dropout_scale;  // kept P's 1 / (1 - p)
    StoreAccumulator<Element, kDPartTiles, kRowBytes>(v_smem + offset_bytes, dv[mt], dv_scale,
                                                      lane);
  }
  __syncthreads();
  const int64_t out_offset = (int64_t{k_begin} + key_first) * f.kv_row_stride +
                             int64_t{kv_head} * f.head_dim;
  StoreRows<kBlockN, T::kRowVecs, kRowBytes, T::kThreads>(
      static_cast<Element*>(args.dk) + out_offset, f.kv_row_stride, k_smem, len_k - key_first,
      vecs_valid, tid);
  StoreRows<kBlockN, T::kRowVecs, kRowBytes, T::kThreads>(
      static_cast<Element*>(args.dv) + out_offset, f.kv_row_stride, v_smem, len_k - key_first,
      vecs_valid, tid);
}

template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kAtomicDq, bool kExtras = false>
__global__ void __launch_bounds__(BwdDkDvTraits<Arch, kDType, kHeadDim, kWide>::kThreads)
    FlashBackwardDkDvPairKernel(const __grid_constant__ BwdArgsOf<kExtras> args) {
  if constexpr (kArchBodyCompiled<Arch>) {
    FlashBackwardDkDvPairCta<Arch, kDType, kHeadDim, kWide, kAtomicDq, kExtras>(args);
  } else {
    __trap();  // an sm80 kernel in an sm_75 binary: never launched there
  }
}

}  // namespace attnserve::kernels::flash
