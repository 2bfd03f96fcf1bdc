// The backward's dQ pass: one CTA per (query block, head, sequence), the forward's geometry. Q,
// dO, lse and D of the block stay resident; K and V tiles of the keys the block sees stream
// through shared memory (two cp.async stages on Sm80, one in the narrow variant at head dims
// 192/256, one register-staged stage on Sm75). Per
// key tile each warp, for its 16 query rows:
//   S = Q K^T,  P = exp2(S * c - lse * log2 e),  dP = dO V^T,
//   dS = P (dP - D) [(1 - tanh^2) with softcap],  dQ += dS K.
// This recomputes S and dP, which FlashAttention-2 avoids by accumulating dQ with float atomics
// from the dK/dV kernel: 7 instead of 5 tile products (1.4x the matrix work), in exchange for a
// deterministic dQ in one pass with no float32 dQ workspace and no conversion kernel.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_traits.cuh"
#include "kernels/flash/bwd_warp_gemm.cuh"
#include "kernels/flash/extras_args.h"
#include "kernels/flash/extras_tile.cuh"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_row_tile.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// One CTA's work; the kernel below is this, or a trap where the path's instructions don't exist.
// kExtras: dropout and ALiBi (NOTES.md "Dropout and ALiBi"), compiled in only where set.
template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kExtras>
__device__ __forceinline__ void FlashBackwardDqCta(const BwdArgsOf<kExtras>& args) {
  using T = BwdDqTraits<Arch, kDType, kHeadDim, kWide>;
  static_assert(T::kResidentRows == T::kStreamRows, "square 64 x 64 tiles");
  using Element = typename T::Element;
  constexpr int kRowBytes = T::kSmemRowBytes;
  constexpr int kBlock = T::kResidentRows;
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdKernelArgs& f = args.fwd;

  // Highest query blocks first: under causal masking they see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int q_begin = f.cu_seqlens_q[batch];
  const int len_q = f.cu_seqlens_q[batch + 1] - q_begin;
  if (m_block * kBlock >= len_q) return;
  const int k_begin = f.cu_seqlens_k[batch];
  const int len_k = f.cu_seqlens_k[batch + 1] - k_begin;
  const FwdBlock block = LocateBlock<kBlock, kBlock>(f, m_block, len_q, len_k);

  const int tid = threadIdx.x;
  const int vecs_valid = f.head_dim / T::kVecElems;
  const int64_t q_offset = (int64_t{q_begin} + block.row_first) * f.q_row_stride +
                           int64_t{head} * f.head_dim;
  Element* dq = static_cast<Element*>(args.dq) + q_offset;
  if (block.n_begin >= block.n_end) {
    ZeroRows<kBlock, T::kRowVecs, T::kThreads>(dq, f.q_row_stride, block.rows_valid, vecs_valid,
                                               tid);
    return;
  }

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = lane / 4;
  const int quad_lane = lane % 4;
  const uint32_t q_smem = ptx::SharedAddress(smem);
  const uint32_t do_smem = q_smem + T::kResidentTileBytes;
  const uint32_t stage_smem = do_smem + T::kResidentTileBytes;
  const FragOffsets frag = FragOffsets::For<kRowBytes>(lane);
  const uint32_t q_rows = q_smem + warp * T::kWarpRows * kRowBytes;  // this warp's 16 rows
  const uint32_t do_rows = do_smem + warp * T::kWarpRows * kRowBytes;

  const int q_stride = static_cast<int>(f.q_row_stride);
  LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
      q_smem, static_cast<const Element*>(f.q) + q_offset, q_stride, block.rows_valid,
      vecs_valid, tid);
  LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
      do_smem, static_cast<const Element*>(args.dout) + q_offset, q_stride, block.rows_valid,
      vecs_valid, tid);

  const int64_t kv_base = int64_t{k_begin} * f.kv_row_stride +
                          int64_t{head / f.head_group} * f.head_dim;
  const int kv_stride = static_cast<int>(f.kv_row_stride);
  const int n_count = block.n_end - block.n_begin;
  auto load_stage = [&](int it) {  // key tile n_end - 1 - it into stage it % kStages
    const int first_key = (block.n_end - 1 - it) * kBlock;
    const uint32_t st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const int64_t offset = kv_base + int64_t{first_key} * f.kv_row_stride;
    LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
        st, static_cast<const Element*>(f.k) + offset, kv_stride, len_k - first_key, vecs_valid,
        tid);
    LoadRowsAsync<Arch, kBlock, T::kRowVecs, kRowBytes, T::kThreads>(
        st + T::kStreamTileBytes, static_cast<const Element*>(f.v) + offset, kv_stride,
        len_k - first_key, vecs_valid, tid);
  };
  if constexpr (T::kStages == 2) load_stage(0);
  ptx::CommitAsyncGroup<Arch>();

  // lse (base 2) and D of this thread's two rows; rows past the sequence contribute nothing
  // (their Q and dO are 0), rows that see no key have lse +inf and P = 0.
  float lse2[2];
  float dsum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * T::kWarpRows + group + 8 * h;
    const int64_t index = int64_t{head} * f.total_q + q_begin + block.row_first + row;
    const bool valid = row < block.rows_valid;
    lse2[h] = valid ? f.lse[index] * args.lse_log2_scale : 0.0f;
    dsum[h] = valid ? args.dsum[index] : 0.0f;
  }

  float dq_acc[T::kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < T::kDTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dq_acc[dt][e] = 0.0f;
  }
  const float exp2_scale = f.exp2_scale;
  for (int it = 0; it < n_count; ++it) {
    if constexpr (T::kStages == 2) {
      if (it + 1 < n_count) load_stage(it + 1);
    } else {
      load_stage(it);  // the previous iteration's closing barrier freed the one stage
    }
    ptx::CommitAsyncGroup<Arch>();
    // Two stages: this tile's group landed, the next one's may be in flight; one: this tile's.
    ptx::WaitAsyncGroups<Arch, T::kStages - 1>();
    __syncthreads();

    const int n = block.n_end - 1 - it;
    const uint32_t k_st = stage_smem + (it % T::kStages) * T::kStageBytes;
    const uint32_t v_st = k_st + T::kStreamTileBytes;

    float s[T::kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
    WarpGemmABt<Arch, Element, T::kSTiles, kHeadDim / T::kMmaK, kRowBytes>(s, q_rows + frag.a,
                                                                    k_st + frag.b);
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
    if constexpr (kExtras) {
      if (f.softcap) SoftcapGradient(s, softcap_grad);
      if (args.x.alibi_slopes != nullptr) {
        AlibiRowTile(s, AlibiSlopePre(args.x, batch, head),
                     block.diagonal + warp * T::kWarpRows + group, n * kBlock + 2 * quad_lane);
      }
    }
    if (n >= block.mask_from || n < block.mask_below) {
      MaskRowTile(s, block.diagonal + warp * T::kWarpRows + group, n * kBlock + 2 * quad_lane,
                  len_k, f);
    }
    if (!f.softcap || kExtras) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = ptx::Exp2(fmaf(s[nt][e], exp2_scale, -lse2[e / 2]));
      }
    }

    float dp[T::kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] = 0.0f;
    }
    WarpGemmABt<Arch, Element, T::kSTiles, kHeadDim / T::kMmaK, kRowBytes>(dp, do_rows + frag.a,
                                                                    v_st + frag.b);
    if constexpr (kExtras) {
      // dS = P o (dP o Z - D) [o (1 - tanh^2)], Z = keep / (1 - p).
      if (args.x.dropout) {
        DropoutRowTile(dp, args.x, args.x.first_sequence + batch, head,
                       block.row_first + warp * T::kWarpRows + group, n * kBlock + 2 * quad_lane,
                       args.x.dropout_scale);
      }
    }
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kExtras) {
          dp[nt][e] = s[nt][e] * (dp[nt][e] - dsum[e / 2]);
          if (f.softcap) dp[nt][e] *= softcap_grad[nt][e];
        } else if (!f.softcap) {
          dp[nt][e] = s[nt][e] * (dp[nt][e] - dsum[e / 2]);
        } else {
          const float t = s[nt][e];  // -inf where masked: p = 0 and the factor clamps to 0
          const float p = ptx::Exp2(fmaf(t, exp2_scale, -lse2[e / 2]));
          dp[nt][e] = p * (dp[nt][e] - dsum[e / 2]) * (1.0f - fminf(t * t, 1.0f));
        }
      }
    }
    uint32_t ds[T::kSTiles / 2][4];
    PackA<Element, T::kSTiles>(ds, dp);
    WarpGemmAB<Arch, Element, T::kSTiles / 2, T::kDTiles, kRowBytes>(dq_acc, ds, k_st + frag.a);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Epilogue: each warp rounds its rows of dQ (times softmax_scale) into its own rows of the Q
  // buffer (only it ever read them) and stores them.
  ptx::WaitAsyncGroups<Arch, 0>();
  __syncwarp();
  StoreAccumulator<Element, T::kDTiles, kRowBytes>(q_rows, dq_acc, args.grad_scale, lane);
  __syncwarp();
  const int warp_row = warp * T::kWarpRows;
  StoreRows<T::kWarpRows, T::kRowVecs, kRowBytes, 32>(
      dq + warp_row * f.q_row_stride, f.q_row_stride, q_rows, block.rows_valid - warp_row,
      vecs_valid, lane);
}

template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kExtras = false>
__global__ void __launch_bounds__(BwdDqTraits<Arch, kDType, kHeadDim, kWide>::kThreads)
    FlashBackwardDqKernel(const __grid_constant__ BwdArgsOf<kExtras> args) {
  if constexpr (kArchBodyCompiled<Arch>) {
    FlashBackwardDqCta<Arch, kDType, kHeadDim, kWide, kExtras>(args);
  } else {
    __trap();  // an sm80 kernel in an sm_75 binary: never launched there
  }
}

}  // namespace attnserve::kernels::flash
