// The Hopper (sm_90a) backward's dQ kernel (head dim 256 in both modes, Sm90BackwardSeparateDq
// in tile_config.h; 64 / 128 / 192 in the deterministic mode): one CTA per (128-row query
// block, head, sequence), the forward's warp-specialized shape and block
// geometry (fwd_block.cuh, the forward's producer and K/V ring: fwd_sm90_ring.cuh, with dO
// loaded beside Q). Per key tile, last to first, each consumer warpgroup for its 64 query rows:
//   S = Q K^T, dP = dO V^T (wgmma SS, both from shared memory, committed as two groups),
//   P = exp2(S c - lse log2 e), dS = P (dP - D) [(1 - tanh^2) with softcap],
//   dQ += dS K (wgmma RS: dS from registers in the accumulator's A-fragment layout, K the
//   N-major B operand, as V in the forward's P V).
// Tile n's dQ product is issued behind tile n-1's S and dP, so the tensor cores run it while
// the warpgroup waits for the scores. dQ stays in registers and is written once, rounded, with
// no float32 workspace, no atomics and no conversion kernel: deterministic. It recomputes S
// and dP, which the dK/dV kernel also computes (3 products here beside its 4 without dQ, where
// the fused kernel has 5). The masks, softcap and rows are the sm80 dQ pass's
// (bwd_dq_kernel.cuh).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_sm90_dq_traits.cuh"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_row_tile.cuh"
#include "kernels/flash/fwd_sm90_ring.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_stage_barriers.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"
#include "kernels/flash/sm90_tile_products.cuh"

namespace attnserve::kernels::flash {

// One consumer warpgroup's 64 query rows of the block against every key tile.
template <DType kDType, int kHeadDim>
class BwdSm90DqRunner {
  using T = BwdSm90DqTraits<kDType, kHeadDim>;
  using Ring = FwdSm90Ring<T>;
  using Element = typename T::Element;
  using MmaScores = ptx::Wgmma<Element, T::kBlockN>;  // S, dP: 64 x kBlockN per warpgroup
  using MmaDq = ptx::Wgmma<Element, kHeadDim>;        // dQ += dS K: 64 x kHeadDim

 public:
  // rows_index: the block's first row in lse and D ([num_heads, total_q]).
  __device__ __forceinline__ BwdSm90DqRunner(const BwdKernelArgs& args, const FwdBlock& block,
                                             int64_t rows_index, const Ring& ring, int warpgroup)
      : args_(args), block_(block), ring_(ring), warpgroup_(warpgroup) {
    const int tid = Sm90ConsumerThread<T>();
    // lse (base 2) and D of this thread's two rows; rows past the sequence add nothing (their
    // Q and dO are zero-filled), rows that see no key have lse +inf and P = 0.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tid / 32 * 16 + tid % 32 / 4 + 8 * h;
      const bool valid = row < block.rows_valid;
      lse2_[h] = valid ? args.fwd.lse[rows_index + row] * args.lse_log2_scale : 0.0f;
      dsum_[h] = valid ? args.dsum[rows_index + row] : 0.0f;
    }
  }

  // The last tile (no dQ product before it) is peeled off, as in the forward, so that what is
  // in flight at each wait is known at compile time (a run-time flag makes ptxas serialize
  // every wgmma, C7515). Each K stage is released once the dQ product reading it is complete,
  // each V stage once dP is.
  __device__ __forceinline__ void Run() {
#pragma unroll
    for (int dt = 0; dt < T::kDqTiles; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dq_[dt][e] = 0.0f;
    }
    uint32_t ds[T::kDqSteps][4];  // dS of the previous tile, the A operand of its dQ product
    const int last = block_.n_end - 1;
    if (last >= block_.mask_from || last < block_.mask_below) {
      Step<true, false>(last, 0, ds);
    } else {
      Step<false, false>(last, 0, ds);
    }
    int i = 1;
    for (int n = last - 1; n >= block_.n_begin; --n, ++i) {
      if (n >= block_.mask_from || n < block_.mask_below) {
        Step<true, true>(n, i, ds);
      } else {
        Step<false, true>(n, i, ds);
      }
    }
    ptx::WgmmaFence();
    IssueFragmentProducts<MmaDq, T::kBlockN>(dq_, ds, ring_.K(i - 1));
    ptx::WgmmaWait<0>(dq_);
    ring_.Release(Ring::kK, i - 1);
  }

  // dQ times grad_scale, rounded, through this warp's rows of the Q tile (every product that
  // read Q is complete) to dq.
  __device__ __forceinline__ void Epilogue(Element* dq) {
    const int tid = Sm90ConsumerThread<T>();
    const float scale[2] = {args_.grad_scale, args_.grad_scale};
    StoreWarpRowsThroughTile<T::kBlockM, T::kRowVecs>(
        ring_.Q(0), dq_, scale, dq, args_.fwd.q_row_stride, block_.rows_valid,
        args_.fwd.head_dim / T::kVecElems, tid / 32, tid % 32);
  }

 private:
  // Key tile n (load-order index i): S(n), dP(n) and (kPrevDq) the previous tile's dQ product
  // on the tensor cores; P and dS of tile n once the scores are in.
  template <bool kMask, bool kPrevDq>
  __device__ __forceinline__ void Step(int n, int i, uint32_t (&ds)[T::kDqSteps][4]) {
    ring_.WaitFull(Ring::kK, i);
    ring_.WaitFull(Ring::kV, i);
    const uint32_t q = ring_.Q(0) + warpgroup_ * 64 * 128;
    float s[T::kSTiles][4];
    float dp[T::kSTiles][4];
    ptx::WgmmaFence();
    IssueRowProducts<MmaScores, T::kBlockM, T::kBlockN, T::kScoreSteps>(s, q, ring_.K(i));
    IssueRowProducts<MmaScores, T::kBlockM, T::kBlockN, T::kScoreSteps>(dp, q + T::kQTileBytes,
                                                                        ring_.V(i));
    if constexpr (kPrevDq) IssueFragmentProducts<MmaDq, T::kBlockN>(dq_, ds, ring_.K(i - 1));
    ptx::WgmmaWait<kPrevDq ? 2 : 1>(s);
    const bool softcap = args_.fwd.softcap;
    if (softcap) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] = ptx::Tanh(s[nt][e] * args_.fwd.softcap_input_scale);
        }
      }
    }
    if constexpr (kMask) {
      const int tid = Sm90ConsumerThread<T>();
      MaskRowTile(s, block_.diagonal + tid / 32 * 16 + tid % 32 / 4,
                  n * T::kBlockN + 2 * (tid % 4), block_.len_k, args_.fwd);
    }
    ptx::WgmmaWait<kPrevDq ? 1 : 0>(dp);
    ring_.Release(Ring::kV, i);
    if constexpr (kPrevDq) {
      ptx::WgmmaWait<0>(dq_);  // ds is free again, K(i - 1) read
      ring_.Release(Ring::kK, i - 1);
    }
    const float exp2_scale = args_.fwd.exp2_scale;
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float t = s[nt][e];  // -inf where masked: P = 0 and softcap's factor clamps to 0
        const float p = ptx::Exp2(fmaf(t, exp2_scale, -lse2_[e / 2]));
        dp[nt][e] = p * (dp[nt][e] - dsum_[e / 2]);
        if (softcap) dp[nt][e] *= 1.0f - fminf(t * t, 1.0f);
      }
    }
#pragma unroll
    for (int kk = 0; kk < T::kDqSteps; ++kk) PackPStep<Element>(dp, kk, ds[kk]);
  }

  const BwdKernelArgs& args_;
  const FwdBlock& block_;
  const Ring& ring_;
  int warpgroup_;  // among the consumers; warp-uniform (from lane 0)
  float lse2_[2];
  float dsum_[2];
  // Per thread: rows (group, group + 8) of its warp's 16; dQ columns 8 dt + 2 quad_lane + {0, 1}.
  float dq_[T::kDqTiles][4];
};

// This CTA's block (query block = reversed blockIdx.x, head = blockIdx.y, sequence =
// blockIdx.z, highest first as in the forward); a block that sees no key gets dQ = 0.
template <DType kDType, int kHeadDim>
__device__ __forceinline__ void FlashBackwardDqSm90Cta(const BwdKernelArgs& args) {
  using T = BwdSm90DqTraits<kDType, kHeadDim>;
  using Element = typename T::Element;
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdKernelArgs& f = args.fwd;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  FwdCta<Element> cta;
  if (!LocateForwardBlock<T::kBlockM, T::kBlockN>(f, m_block, blockIdx.y, blockIdx.z, cta)) {
    return;
  }
  // dq has q's layout: the block's rows of dq sit where its rows of q do.
  Element* dq = static_cast<Element*>(args.dq) + (cta.q - static_cast<const Element*>(f.q));
  if (SeesNoKeys(cta.block)) {
    ZeroRows<T::kBlockM, T::kRowVecs, T::kThreads>(dq, f.q_row_stride, cta.block.rows_valid,
                                                   f.head_dim / T::kVecElems, threadIdx.x);
    return;
  }
  const int64_t rows_index = cta.lse - f.lse;  // lse and D share the [num_heads, total_q] layout
  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const FwdSm90Ring<T> ring((ptx::SharedAddress(smem) + 1023u) & ~1023u);
  RunSm90Roles<T>(
      ring,
      [&] {
        FwdSm90Producer<T> producer(f, ring, args.dout);
        producer.Block(cta);
        producer.Finish();
      },
      [&](int consumer) {
        BwdSm90DqRunner<kDType, kHeadDim> runner(args, cta.block, rows_index, ring, consumer);
        runner.Run();
        runner.Epilogue(dq);
      });
}

// Compiled only in sm_90a code (the instantiation files are built for that target alone); any
// other pass sees a trap, never launched.
template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(BwdSm90DqTraits<kDType, kHeadDim>::kThreads, 1)
    FlashBackwardDqSm90Kernel(const __grid_constant__ BwdKernelArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashBackwardDqSm90Cta<kDType, kHeadDim>(args);
#else
  __trap();
#endif
}

}  // namespace attnserve::kernels::flash
