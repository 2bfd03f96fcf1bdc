// The Hopper (sm_90a) backward dK/dV kernel on warpgroup MMA, FlashAttention-3's backward
// structure without its producer warp (NOTES.md "Hopper backward").
// One CTA per (128-key block, kv head, sequence), two warpgroups of 64 keys. K and V stay in
// shared memory; for each query head of the kv head's group (GQA: dK/dV summed in registers) and
// each query tile that sees a key of the block, Q, dO, lse and D stream through two cp.async
// stages in wgmma's 128-byte swizzle (zero-filled past the sequence, as in the forward). Per
// tile and warpgroup:
//   S^T = K Q^T, dP^T = V dO^T          wgmma SS (K-major operands), 64 keys x 64 queries
//   P^T = exp2(S^T c - lse log2 e)       registers (the sm80 kernel's masks and softcap)
//   dV += P^T dO                         wgmma RS (P^T's accumulator layout is the A fragment;
//                                        dO is the N-major B operand), under the dS^T math
//   dS^T = P^T (dP^T - D)                registers, also rounded into a [key][query] tile
//   dK += dS^T Q                         wgmma RS
//   dQ (+)= dS K                         wgmma SS, both operands MN-major (dS^T tile, K),
//                                        64 queries x half the head dim per warpgroup, added
//                                        to the float32 dQ workspace (red.global.add.v4.f32)
// so only the atomic-dQ mode exists here (the deterministic one stays on the sm80 path); the
// preprocess (D) and the dQ conversion are the sm80 path's kernels. dK is scaled by
// softmax_scale at the end. Two CTA barriers per tile: the loop top (stages) and one before dQ
// (both warpgroups' dS^T rows).
// With ATTN_FLASH_SM90_BWD_DEFER_DQ=1 (tile_config.h; off by default, head dim 64 only: at 128
// it spills) each tile's dQ product is issued in the next tile instead, straight behind its S^T
// / dP^T, so that the tensor cores have it during the P^T math; its reductions run under dV /
// dK, the dS^T tile is double-buffered and the barrier before dQ goes (RunDeferred):
//   S^T(it), dP^T(it), dQ(it-1)        one fence, three committed groups; wait for S^T
//   P^T(it); dV += P^T dO              wait for dP^T
//   dS^T(it) -> dS^T tile it % 2; dK += dS^T Q
//   wait for dQ(it-1), its reductions; wait for dV, dK
//   ---- loop-top fence.proxy.async + barrier (publishes tile it's dS^T to dQ(it)) ----
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_sm90_block.cuh"
#include "kernels/flash/bwd_sm90_traits.cuh"
#include "kernels/flash/fwd_sm90_kernel.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"

namespace attnserve::kernels::flash {

// Keeps the compiler from moving reads of wgmma accumulators above the wait that completed them
// (ptx::WgmmaWait pins one array; dK and dV are read after the last wait of the loop).
template <int kRows, int kCols>
__device__ __forceinline__ void PinRegisters(float (&regs)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(regs[i][j])::"memory");
  }
}

template <DType kDType, int kHeadDim>
class BwdSm90BlockRunner : public BwdSm90Block<BwdSm90Traits<kDType, kHeadDim>> {
  using T = BwdSm90Traits<kDType, kHeadDim>;
  using Base = BwdSm90Block<T>;
  using typename Base::Element;
  using typename Base::MmaScores;
  using typename Base::MmaGrad;
  using MmaDq = ptx::Wgmma<Element, T::kDqCols>;  // 64 queries x 32 or 64 columns
  using Base::args_, Base::key_first_, Base::iters_, Base::k_smem_, Base::v_smem_,
      Base::ds_smem_;
  using Base::StageSmem, Base::LoadStage, Base::IssueScores, Base::IssueGrad, Base::ScoresToP,
      Base::StoreKeyRows, Base::AddDq;

 public:
  // Per thread of warp w (of its warpgroup), lane l: S^T / dP^T / dK / dV rows (keys)
  // 64 warpgroup + 16 w + l / 4 (+ 8), columns 8 t + 2 (l % 4) + {0, 1} of 8-column tile t.
  __device__ __forceinline__ BwdSm90BlockRunner(const BwdKernelArgs& args, uint32_t smem,
                                                int batch, int kv_head, int n_block)
      : Base(args, smem, batch, kv_head, n_block) {}

  // One query tile per iteration. Every wgmma of a tile is complete at the end of its Step, so
  // the barrier at the top of the next iteration frees that tile's stage (which then takes the
  // tile after the next) and the dS^T tile.
  __device__ __forceinline__ void Run() {
    ZeroGrad();
    for (int it = 0; it < iters_; ++it) {
      BeginTile(it);
      Step(it);
    }
  }

  // Run() with each tile's dQ product deferred to the next tile (ATTN_FLASH_SM90_BWD_DEFER_DQ,
  // traits kDeferDq; StepDeferred). Tile it's dS^T tile (buffer it % 2) is published to both
  // warpgroups by the loop-top fence and barrier of tile it+1, whose dQ product (each
  // warpgroup's half of the head dim) reads it while tile it+1's dS^T goes into the other
  // buffer; the last tile's dQ follows the loop behind one more fence and barrier. The first
  // tile is a separate instantiation (no dQ), so the wgmma groups in flight at every wait are
  // compile-time facts (no serialization).
  __device__ __forceinline__ void RunDeferred() {
    ZeroGrad();
    if (iters_ == 0) return;
    BeginTile(0);
    StepDeferred<false>(0);
    for (int it = 1; it < iters_; ++it) {
      BeginTile(it);
      StepDeferred<true>(it);
    }
    const int tid = ptx::FreshThreadIdx();
    Dq(iters_ - 1, tid / 128, tid % 128 / 32, tid % 32 / 4, tid % 4);
  }

  // dK (times softmax_scale) and dV through the K and V buffers (each warp its own 16 rows),
  // then 16-byte stores of the rows that exist.
  __device__ __forceinline__ void Epilogue() {
    ptx::WaitAsyncGroups<Sm80, 0>();
    __syncthreads();  // no wgmma reads K or V any more (dQ of both warpgroups reads all of K)
    const int tid = threadIdx.x;
    StoreKeyRows(dk_, args_.grad_scale, k_smem_, args_.dk, tid / 32, tid % 32);
    StoreKeyRows(dv_, 1.0f, v_smem_, args_.dv, tid / 32, tid % 32);
  }

 private:
  // Query tile `it`: the five products, with the P^T and dS^T math under the running wgmma.
  __device__ __forceinline__ void Step(int it) {
    const int tid = ptx::FreshThreadIdx();
    const int warpgroup = tid / 128;
    const int warp = tid % 128 / 32;
    const int group = tid % 32 / 4;
    const int quad_lane = tid % 4;
    const uint32_t q_st = StageSmem(it);
    const uint32_t do_st = q_st + T::kTileBytes;
    const uint32_t dsum_at = q_st + 2 * T::kTileBytes + T::kBlockM * 4 + 2 * quad_lane * 4;

    float s[T::kSTiles][4];
    float dp[T::kSTiles][4];
    ptx::WgmmaFence();
    IssueScores(s, k_smem_ + warpgroup * 64 * 128, q_st);
    IssueScores(dp, v_smem_ + warpgroup * 64 * 128, do_st);
    ptx::WgmmaWait<1>(s);

    // P^T into the A fragments of dV += P^T dO; s keeps G for dS^T.
    uint32_t p[T::kGradSteps][4];
    ScoresToP(s, p, it, key_first_ + warpgroup * 64 + warp * 16, group, quad_lane);
    ptx::WgmmaFence();
    IssueGrad(dv_, p, do_st);
    // S^T and dP^T are done; dV runs on under the dS^T math (its P^T fragments stay live until
    // the last wait of the tile).
    ptx::WgmmaWait<1>(dp);

    uint32_t ds[T::kGradSteps][4];
    GradToDs(s, dp, ds, it, dsum_at, warpgroup, warp, group, quad_lane);
    ptx::WgmmaFence();
    IssueGrad(dk_, ds, q_st);
    Dq(it, warpgroup, warp, group, quad_lane);  // dV and dK complete with dQ
  }

  // (kDeferDq) Query tile `it` and, kDq (every tile but the first), tile it-1's dQ product:
  // issued straight behind this tile's S^T / dP^T, so the tensor cores run it during the P^T
  // math (in Step only dP^T is there to hide it, and both warpgroups then meet at the barrier
  // before dQ); its reductions run under the dV / dK products. Tile it-1's dS^T tile (buffer
  // (it-1) % 2) was published by the loop-top barrier; tile it's goes into the other buffer,
  // which no wgmma reads any more (tile it-2's dQ products, in both warpgroups, completed before
  // that barrier). Otherwise Step's order. Every wgmma of the tile is complete at its end, as
  // in Step.
  template <bool kDq>
  __device__ __forceinline__ void StepDeferred(int it) {
    const int tid = ptx::FreshThreadIdx();
    const int warpgroup = tid / 128;
    const int warp = tid % 128 / 32;
    const int group = tid % 32 / 4;
    const int quad_lane = tid % 4;
    const uint32_t q_st = StageSmem(it);
    const uint32_t do_st = q_st + T::kTileBytes;
    const uint32_t dsum_at = q_st + 2 * T::kTileBytes + T::kBlockM * 4 + 2 * quad_lane * 4;
    const int dq_col0 = warpgroup * T::kDqCols;

    float s[T::kSTiles][4];
    float dp[T::kSTiles][4];
    float dq[T::kDqTiles][4];
    ptx::WgmmaFence();
    IssueScores(s, k_smem_ + warpgroup * 64 * 128, q_st);
    IssueScores(dp, v_smem_ + warpgroup * 64 * 128, do_st);
    if constexpr (kDq) IssueDq(dq, DsSmem(it - 1), DqKColumns(dq_col0));
    // In flight: S^T, dP^T (, dQ of it-1): wait for S^T only.
    ptx::WgmmaWait<kDq ? 2 : 1>(s);

    uint32_t p[T::kGradSteps][4];
    ScoresToP(s, p, it, key_first_ + warpgroup * 64 + warp * 16, group, quad_lane);
    ptx::WgmmaFence();
    IssueGrad(dv_, p, do_st);
    // In flight: dP^T (, dQ of it-1), dV: wait for dP^T only.
    ptx::WgmmaWait<kDq ? 2 : 1>(dp);

    uint32_t ds[T::kGradSteps][4];
    GradToDs(s, dp, ds, it, dsum_at, warpgroup, warp, group, quad_lane);
    ptx::WgmmaFence();
    IssueGrad(dk_, ds, q_st);
    if constexpr (kDq) {
      // In flight: dQ (it-1), dV, dK: the reductions run under dV / dK.
      ptx::WgmmaWait<2>(dq);
      AddDq(dq, it - 1, warp * 16 + group, dq_col0 + 4 * (quad_lane / 2), quad_lane & 1);
    }
    // dV and dK: the stage is free at the next loop-top barrier, and dK / dV are read after
    // this wait (next tile's products, the epilogue).
    ptx::WgmmaWait<0>(dk_);
    PinRegisters(dv_);
  }

  // The loop top of tile it (Run, RunDeferred): tile it has landed and, with every wgmma of
  // tile it-1 complete in both warpgroups, tile it-1's stage and (RunDeferred: the older) dS^T
  // tile are free; the fence in every thread also hands tile it-1's dS^T stores to the tensor
  // cores (RunDeferred's dQ product of it-1 reads them). Then tile it+1 is loaded into the freed
  // stage.
  __device__ __forceinline__ void BeginTile(int it) {
    ptx::WaitAsyncGroups<Sm80, 0>();
    ptx::FenceProxyAsyncShared();
    __syncthreads();
    if (it + 1 < iters_) LoadStage(it + 1);
    ptx::CommitAsyncGroup<Sm80>();
  }

  // dS^T = G (dP^T - D) of tile it (s holds G, dsum_at addresses the thread's D pairs in the
  // stage): the A fragments of dK += dS^T Q, and the [key][query] tile that dQ reads
  // (DsSmem(it)).
  __device__ __forceinline__ void GradToDs(const float (&s)[T::kSTiles][4],
                                           const float (&dp)[T::kSTiles][4],
                                           uint32_t (&ds)[T::kGradSteps][4], int it,
                                           uint32_t dsum_at, int warpgroup, int warp, int group,
                                           int quad_lane) {
    const int key_row = warpgroup * 64 + warp * 16 + group;
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
      const float2 dsum = ptx::LoadSharedFloat2(dsum_at + nt * 32);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t packed =
            ptx::PackPair<Element>(s[nt][2 * h] * (dp[nt][2 * h] - dsum.x),
                                   s[nt][2 * h + 1] * (dp[nt][2 * h + 1] - dsum.y));
        ds[nt / 2][(nt % 2) * 2 + h] = packed;
        ptx::StoreShared32(
            DsSmem(it) + SwizzledOffset<T::kBlockN>(key_row + 8 * h, nt) + quad_lane * 4, packed);
      }
    }
  }

  // dQ = dS K of tile it once both warpgroups' dS^T rows are in shared memory (written by the
  // generic proxy, read by the tensor cores: fence, then barrier), then its reductions. Step's
  // dV / dK products, still in flight, complete with it (RunDeferred's last tile has none).
  __device__ __forceinline__ void Dq(int it, int warpgroup, int warp, int group, int quad_lane) {
    ptx::FenceProxyAsyncShared();
    __syncthreads();
    float dq[T::kDqTiles][4];
    const int dq_col0 = warpgroup * T::kDqCols;
    const uint32_t k_cols = DqKColumns(dq_col0);
    ptx::WgmmaFence();
    IssueDq(dq, DsSmem(it), k_cols);
    ptx::WgmmaWait<0>(dq);
    PinRegisters(dk_);
    PinRegisters(dv_);
    AddDq(dq, it, warp * 16 + group, dq_col0 + 4 * (quad_lane / 2), quad_lane & 1);
  }

  // dQ = dS K for 64 queries x kDqCols columns, one committed group (the caller fences first):
  // A the dS^T tile at `ds` (DsSmem), B K's columns from `k_cols` (DqKColumns), both MN-major.
  __device__ __forceinline__ void IssueDq(float (&dq)[T::kDqTiles][4], uint32_t ds,
                                          uint32_t k_cols) {
#pragma unroll
    for (int kk = 0; kk < T::kDqSteps; ++kk) {
      // 16 keys per step: 16 rows of 128 bytes in both MN-major tiles.
      const uint64_t a = ptx::MatrixDescriptor128B(ds + kk * 16 * 128, T::kBlockN * 128, 1024);
      const uint64_t b =
          ptx::MatrixDescriptor128B(k_cols + kk * 16 * 128, T::kBlockN * 128, 1024);
      MmaDq::SSTrans(dq, a, b, kk > 0);
    }
    ptx::WgmmaCommit();
  }

  // K's columns col0.. as dQ's B operand: head-dim block col0 / 64, byte (col0 % 64) * 2 of its
  // rows (N = 32 starts mid-row at 64 bytes; the swizzle comes from the address bits, as for the
  // 32-byte k steps of the K-major operands).
  __device__ __forceinline__ uint32_t DqKColumns(int col0) const {
    return k_smem_ + (col0 / 64) * T::kBlockN * 128 + (col0 % 64) * 2;
  }

  // Tile it's dS^T tile: one, or (kDeferDq) one per tile parity, so that tile it+1's can be
  // written while tile it's dQ product reads it.
  __device__ __forceinline__ uint32_t DsSmem(int it) const {
    return ds_smem_ + (it % T::kDsBuffers) * T::kDsBytes;
  }

  __device__ __forceinline__ void ZeroGrad() {
#pragma unroll
    for (int nt = 0; nt < T::kDTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk_[nt][e] = 0.0f;
        dv_[nt][e] = 0.0f;
      }
    }
  }

  float dk_[T::kDTiles][4];
  float dv_[T::kDTiles][4];
};

template <DType kDType, int kHeadDim>
__device__ __forceinline__ void FlashBackwardDkDvSm90Cta(const BwdKernelArgs& args) {
  extern __shared__ __align__(16) unsigned char smem[];
  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const uint32_t base = (ptx::SharedAddress(smem) + 1023u) & ~1023u;
  const BwdSm90CtaCoords cta = Sm90BackwardCtaCoords(args.fwd);
  BwdSm90BlockRunner<kDType, kHeadDim> runner(args, base, cta.batch, cta.kv_head, cta.n_block);
  if (!runner.Exists()) return;
  runner.Prologue();
  if constexpr (BwdSm90Traits<kDType, kHeadDim>::kDeferDq) {
    runner.RunDeferred();
  } else {
    runner.Run();
  }
  runner.Epilogue();
}

// Compiled only in sm_90a code (the instantiation files are built for that target alone); any
// other pass sees a trap, never launched.
template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(BwdSm90Traits<kDType, kHeadDim>::kThreads, 1)
    FlashBackwardDkDvSm90Kernel(const __grid_constant__ BwdKernelArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashBackwardDkDvSm90Cta<kDType, kHeadDim>(args);
#else
  __trap();
#endif
}

}  // namespace attnserve::kernels::flash
