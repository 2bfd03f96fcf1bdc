// The Hopper (sm_90a) backward dK/dV kernel on warpgroup MMA, FlashAttention-3's backward
// structure (NOTES.md "Hopper backward").
// One CTA per (128-key block, kv head, sequence): a producer warpgroup and two consumer
// warpgroups of 64 keys. K and V stay in shared memory; for each query head of the kv head's
// group (GQA: dK/dV summed in registers) and each query tile that sees a key of the block, the
// producer streams Q, dO, lse and D through two cp.async stages in wgmma's 128-byte swizzle
// (zero-filled past the sequence, as in the forward), handed over by full / empty mbarriers
// (sm90_stage_barriers.cuh). Per tile and consumer warpgroup:
//   S^T = K Q^T, dP^T = V dO^T          wgmma SS (K-major operands), 64 keys x 64 queries
//   P^T = exp2(S^T c - lse log2 e)       registers (the sm80 kernel's masks and softcap)
//   dV += P^T dO                         wgmma RS (P^T's accumulator layout is the A fragment;
//                                        dO is the N-major B operand), under the dS^T math
//   dS^T = P^T (dP^T - D)                registers, also rounded into a [key][query] tile
//   dK += dS^T Q                         wgmma RS
//   dQ (+)= dS K                         wgmma SS, both operands MN-major (dS^T tile, K),
//                                        64 queries x half the head dim per warpgroup, added
//                                        to the float32 dQ workspace by tile (one bulk
//                                        reduction per warp, bwd_sm90_dq_tiles.h); at head
//                                        dim 64 issued in the next tile (kDeferredDq)
// (at 128 issued before dK, so that its reduction runs under dK). That is the atomic-dQ mode;
// the deterministic mode instantiates it without dQ (kFusedDq false): dK and dV only, and the
// dQ kernel (bwd_sm90_dq_kernel.cuh) computes dQ. The preprocess (D) is the sm80 path's kernel.
// dK is scaled by softmax_scale at the end. With dQ, one barrier per tile among the consumers,
// before dQ (both warpgroups' dS^T rows); it keeps them within a tile of each other, so two dS^T
// buffers (by tile parity) suffice. At head dim 64 the kernel mostly runs persistent
// (FlashBackwardDkDvSm90PersistentKernel; Sm90BackwardRunsPersistent in tile_config.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_sm90_block.cuh"
#include "kernels/flash/bwd_sm90_dq_tiles.h"
#include "kernels/flash/bwd_sm90_traits.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"

namespace attnserve::kernels::flash {

template <DType kDType, int kHeadDim, bool kFusedDq, bool kPersistent>
class BwdSm90BlockRunner
    : public BwdSm90Block<BwdSm90Traits<kDType, kHeadDim, kFusedDq, kPersistent>> {
  using T = BwdSm90Traits<kDType, kHeadDim, kFusedDq, kPersistent>;
  using Base = BwdSm90Block<T>;
  using typename Base::Element;
  using typename Base::MmaScores;
  using typename Base::MmaGrad;
  using MmaDq = ptx::Wgmma<Element, T::kDqCols>;  // 64 queries x 32 or 64 columns
  using typename Base::QueryTile;
  using Base::args_, Base::f_, Base::key_first_, Base::iters_, Base::k_smem_, Base::v_smem_,
      Base::ds_smem_, Base::len_q_, Base::q_begin_, Base::batch_;
  using Base::StageSmem, Base::FirstTile, Base::Next, Base::IssueScores, Base::IssueGrad,
      Base::StoreKeyRows, Base::barriers_;
  // Named barrier of the 256 consumer threads (0 is __syncthreads').
  static constexpr int kConsumersBarrier = 1;

 public:
  // Per thread of warp w (of its consumer warpgroup), lane l: S^T / dP^T / dK / dV rows (keys)
  // 64 warpgroup + 16 w + l / 4 (+ 8), columns 8 t + 2 (l % 4) + {0, 1} of 8-column tile t.
  __device__ __forceinline__ BwdSm90BlockRunner(const BwdKernelArgs& args, uint32_t smem,
                                                int batch, int kv_head, int n_block,
                                                BwdSm90Progress progress = {})
      : Base(args, smem, batch, kv_head, n_block, progress) {}

  // The consumers: one query tile per iteration, its stage released once every wgmma of the
  // tile is complete (the end of its Step). Two copies of the loop, with and without softcap,
  // so that the common case issues no softcap code at all.
  __device__ __forceinline__ void Run() {
    if (f_.softcap) {
      RunTiles<true>();
    } else {
      RunTiles<false>();
    }
  }

  // dK (times softmax_scale) and dV through the K and V buffers (each warp its own 16 rows),
  // then 16-byte stores of the rows that exist.
  // Persistent: a block without query tiles stores zeros straight, and the others release their
  // K/V buffer to the producer once its rows are read back out.
  __device__ __forceinline__ void Epilogue() {
    if constexpr (kFusedDq) this->FinishDqPieces();
    if constexpr (T::kPersistent) {
      if (iters_ == 0) {
        this->StoreZeroKeyRows();
        return;
      }
    }
    // No wgmma reads K or V any more (dQ of both warpgroups reads all of K).
    ptx::NamedBarrierSync<T::kConsumerThreads>(kConsumersBarrier);
    const int tid = Sm90ConsumerThread<T>();
    StoreKeyRows(dk_, args_.grad_scale, k_smem_, args_.dk, tid / 32, tid % 32);
    StoreKeyRows(dv_, 1.0f, v_smem_, args_.dv, tid / 32, tid % 32);
    this->ReleaseKvBuffer();
  }

 private:
  template <bool kSoftcap>
  __device__ __forceinline__ void RunTiles() {
#pragma unroll
    for (int nt = 0; nt < T::kDTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk_[nt][e] = 0.0f;
        dv_[nt][e] = 0.0f;
      }
    }
    if (iters_ == 0) return;
    if constexpr (T::kRsScores) LoadKeyFragments();
    if constexpr (T::kDeferredDq) {
      this->template RunDeferredDqTiles<kConsumersBarrier>(
          [&](int it, QueryTile prev, QueryTile tile, auto has_prev) {
            Step<kSoftcap, decltype(has_prev)::value>(it, prev, tile);
          },
          [&](QueryTile tile) {
            const int tid = Sm90ConsumerThread<T>();
            const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
            float dq[T::kDqTiles][4];
            ptx::WgmmaFence();
            IssueDq(dq, DsSmem(iters_ - 1), warpgroup);
            ptx::WgmmaWait<0>(dq);
            AddDqPiece(dq, tile, warpgroup * 4 + tid % 128 / 32, tid % 32);
          });
    } else {
      QueryTile tile = FirstTile();
      const auto run_tile = [&](int it) {
        barriers_.WaitFull(0, this->Tile(it));
        Step<kSoftcap, false>(it, tile, tile);
        barriers_.Release(0, this->Tile(it));
        Next(tile);
      };
      // With K/V fragments the first tile runs before the loop, as in RunDeferredDqTiles: with
      // them read only inside the loop, ptxas 13.0 took their registers for dead once S^T and
      // dP^T were issued and gave them to P^T and dS^T (dK came out wrong). Without them the
      // loop stays whole (peeled at 128, ptxas injected warpgroup.arrive fences: C7519).
      int it = 0;
      if constexpr (T::kRsScores) run_tile(it++);
      for (; it < iters_; ++it) run_tile(it);
    }
  }

  __device__ __forceinline__ uint32_t DsSmem(int it) const {
    return ds_smem_ + (this->Tile(it) % T::kDsBuffers) * T::kDsBytes;
  }

  // dQ (this warpgroup's columns) = dS K from the dS^T tile at ds_st, one committed group.
  __device__ __forceinline__ void IssueDq(float (&dq)[T::kDqTiles][4], uint32_t ds_st,
                                          int warpgroup) {
    this->template IssueDqColumns<MmaDq>(dq, ds_st, warpgroup * T::kDqCols);
  }

  // Query tile it (`tile`): the five products, with the P^T and dS^T math under the running
  // wgmma. kPrevDq (deferred dQ only): the previous tile's (`prev`) dQ is issued behind S^T and
  // dP^T, and its reduction runs under dV and dK.
  template <bool kSoftcap, bool kPrevDq>
  __device__ __forceinline__ void Step(int it, QueryTile prev, QueryTile tile) {
    const uint32_t q_st = StageSmem(it);
    const uint32_t ds_st = DsSmem(it);
    const int tid = Sm90ConsumerThread<T>();
    // Warp-uniform as far as the compiler can see (broadcast from lane 0), so that the operand
    // addresses and descriptors stay in uniform registers.
    const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int warp = tid % 128 / 32;
    const int group = tid % 32 / 4;
    const int quad_lane = tid % 4;
    const uint32_t do_st = q_st + T::kTileBytes;

    float s[T::kSTiles][4];
    float dp[T::kSTiles][4];
    if constexpr (T::kRsScores) {
      ptx::WgmmaFence();
      IssueScores(s, kv_frag_[0], q_st);
      IssueScores(dp, kv_frag_[1], do_st);
    } else {
      ptx::WgmmaFence();
      IssueScores(s, k_smem_ + warpgroup * 64 * 128, q_st);
      IssueScores(dp, v_smem_ + warpgroup * 64 * 128, do_st);
    }
    float dq[T::kDqTiles][4];
    if constexpr (kPrevDq) IssueDq(dq, DsSmem(it - 1), warpgroup);
    // The tile's lse and D: at 64 read under the running wgmma (their shared-memory latency
    // was the largest stall there); at 128 where they are used, for want of registers.
    float2 lse[T::kSTiles];
    float2 dsum[T::kSTiles];
    if constexpr (T::kEarlyVectors) {
      this->LoadStageVector(q_st, 0, quad_lane, lse);
      this->LoadStageVector(q_st, 1, quad_lane, dsum);
    }
    // In flight: S^T, dP^T (, dQ of the previous tile): wait for S^T only.
    ptx::WgmmaWait<kPrevDq ? 2 : 1>(s);

    // P^T into the A fragments of dV += P^T dO; s keeps G for dS^T.
    uint32_t p[T::kGradSteps][4];
    if constexpr (!T::kEarlyVectors) this->LoadStageVector(q_st, 0, quad_lane, lse);
    this->template ScoresToP<kSoftcap>(s, p, tile.row0, lse,
                                       key_first_ + warpgroup * 64 + warp * 16, group, quad_lane);
    ptx::WgmmaFence();
    IssueGrad(dv_, p, do_st);
    // S^T and dP^T are done; dV (and the previous dQ) run on under the dS^T math (its P^T
    // fragments stay live until the last wait of the tile).
    ptx::WgmmaWait<kPrevDq ? 2 : 1>(dp);
    if constexpr (!T::kEarlyVectors) this->LoadStageVector(q_st, 1, quad_lane, dsum);

    // dS^T = G (dP^T - D): the A fragments of dK += dS^T Q, and the [key][query] tile of dQ.
    uint32_t ds[T::kGradSteps][4];
    const int key_row = warpgroup * 64 + warp * 16 + group;
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t packed =
            ptx::PackPair<Element>(s[nt][2 * h] * (dp[nt][2 * h] - dsum[nt].x),
                                   s[nt][2 * h + 1] * (dp[nt][2 * h + 1] - dsum[nt].y));
        ds[nt / 2][(nt % 2) * 2 + h] = packed;
        if constexpr (kFusedDq) {
          ptx::StoreShared32(
              ds_st + SwizzledOffset<T::kBlockN>(key_row + 8 * h, nt) + quad_lane * 4, packed);
        }
      }
    }
    const int piece = warpgroup * 4 + warp;
    if constexpr (!kFusedDq) {
      ptx::WgmmaFence();
      IssueGrad(dk_, ds, q_st);
      ptx::WgmmaWait<0>(dk_);
      ptx::PinRegisters(dv_);  // dV is read after the loop's last wait
    } else if constexpr (T::kDeferredDq) {
      ptx::WgmmaFence();
      IssueGrad(dk_, ds, q_st);
      if constexpr (kPrevDq) {
        // In flight, in issue order: the previous dQ, dV, dK.
        ptx::WgmmaWait<2>(dq);
        AddDqPiece(dq, prev, piece, tid % 32);
      }
      ptx::WgmmaWait<0>(dk_);
      ptx::PinRegisters(dv_);
    } else {
      // dQ = dS K once both warpgroups' dS^T rows are in shared memory, issued before dK so
      // that its staging and reduction run under dK.
      Base::template PublishDs<kConsumersBarrier>();
      ptx::WgmmaFence();
      IssueDq(dq, ds_st, warpgroup);
      IssueGrad(dk_, ds, q_st);
      ptx::WgmmaWait<1>(dq);
      AddDqPiece(dq, tile, piece, tid % 32);
      ptx::WgmmaWait<0>(dk_);
      ptx::PinRegisters(dv_);
    }
  }

  // This warp's piece of the tile's dQ, one product (BwdSm90Block's dQ by tile).
  __device__ __forceinline__ void AddDqPiece(const float (&dq)[T::kDqTiles][4], QueryTile tile,
                                             int piece, int lane) {
    this->AwaitDqStaging(lane);
    this->StageDqTiles(dq, 0, piece, lane);
    this->ReduceDqPiece(tile, piece, lane);
  }

  // T::kRsScores: K's and V's A fragments, once before the tile loop (the first tile's loads
  // bring K and V).
  __device__ __forceinline__ void LoadKeyFragments() {
    barriers_.WaitFull(0, this->Tile(0));
    const int tid = Sm90ConsumerThread<T>();
    const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
    LoadKeyFragments(kv_frag_[0], k_smem_, warpgroup, tid % 128 / 32, tid % 32);
    LoadKeyFragments(kv_frag_[1], v_smem_, warpgroup, tid % 128 / 32, tid % 32);
  }
  // This warp's 16 keys of K or V (`tile`) as the A fragments of each k16 step (ldmatrix from
  // the swizzled tile; generic-proxy reads of the producer's cp.async writes).
  __device__ __forceinline__ static void LoadKeyFragments(uint32_t (&frag)[T::kScoreSteps][4],
                                                          uint32_t tile, int warpgroup, int warp,
                                                          int lane) {
    // ldmatrix.x4: lanes 8j.. address matrix j = (rows 0-7 | 8-15) x (k 0-7 | 8-15).
    const int row = warpgroup * 64 + warp * 16 + lane % 8 + 8 * (lane / 8 % 2);
#pragma unroll
    for (int kk = 0; kk < T::kScoreSteps; ++kk) {
      ptx::LoadMatrixX4(frag[kk], tile + SwizzledOffset<T::kBlockN>(row, 2 * kk + lane / 16));
    }
  }
  // T::kRsScores: K's (0) and V's (1) A fragments, loaded before the block's first tile.
  uint32_t kv_frag_[T::kRsScores ? 2 : 1][T::kRsScores ? T::kScoreSteps : 1][4];
  float dk_[T::kDTiles][4];
  float dv_[T::kDTiles][4];
};

template <DType kDType, int kHeadDim, bool kFusedDq>
__device__ __forceinline__ void FlashBackwardDkDvSm90Cta(const BwdKernelArgs& args) {
  using T = BwdSm90Traits<kDType, kHeadDim, kFusedDq, false>;
  extern __shared__ __align__(16) unsigned char smem[];
  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const uint32_t base = (ptx::SharedAddress(smem) + 1023u) & ~1023u;
  const DkDvCtaCoords cta = HeadsFirstDkDvCta(args.fwd);
  BwdSm90BlockRunner<kDType, kHeadDim, kFusedDq, false> runner(args, base, cta.batch,
                                                               cta.kv_head, cta.n_block);
  if (!runner.Exists()) return;
  RunSm90Roles<T>(
      runner.barriers(), [&] { runner.Produce(); },
      [&](int) {
        runner.Run();
        runner.Epilogue();
      });
}

// Persistent (head dim 64; Sm90BackwardRunsPersistent): each role walks the CTA's key blocks
// (ForEachDkDvBlock), a runner per block; the producer loads ahead into the ring and the other
// K/V buffer while the consumers finish a block.
template <DType kDType, int kHeadDim, bool kFusedDq>
__device__ __forceinline__ void FlashBackwardDkDvSm90PersistentCta(const BwdKernelArgs& args,
                                                                   const DkDvBlocks& blocks) {
  using T = BwdSm90Traits<kDType, kHeadDim, kFusedDq, true>;
  using Runner = BwdSm90BlockRunner<kDType, kHeadDim, kFusedDq, true>;
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t base = (ptx::SharedAddress(smem) + 1023u) & ~1023u;
  if (threadIdx.x == 0) Runner::KvRing(base).Init(T::kProducerThreads, T::kConsumerThreads);
  const typename Runner::Barriers barriers(Runner::StageBarriers(base));
  // Each role runs the same blocks in the same order and counts the same progress.
  auto each_block = [&](auto&& run) {
    BwdSm90Progress progress;
    ForEachDkDvBlock(args.fwd, blocks, [&](const DkDvCtaCoords& cta) {
      Runner runner(args, base, cta.batch, cta.kv_head, cta.n_block, progress);
      if (!runner.Exists()) return;
      run(runner);
      progress = runner.ProgressAfter(progress);
    });
  };
  RunSm90Roles<T>(
      barriers, [&] { each_block([](Runner& runner) { runner.Produce(); }); },
      [&](int) {
        each_block([](Runner& runner) {
          runner.Run();
          runner.Epilogue();
        });
      });
}

// Compiled only in sm_90a code (the instantiation files are built for that target alone); any
// other pass sees a trap, never launched.
template <DType kDType, int kHeadDim, bool kFusedDq>
__global__ void __launch_bounds__(BwdSm90Traits<kDType, kHeadDim, kFusedDq, false>::kThreads, 1)
    FlashBackwardDkDvSm90Kernel(const __grid_constant__ BwdKernelArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashBackwardDkDvSm90Cta<kDType, kHeadDim, kFusedDq>(args);
#else
  __trap();
#endif
}

// The persistent variant (head dim 64 only).
template <DType kDType, int kHeadDim, bool kFusedDq>
__global__ void __launch_bounds__(BwdSm90Traits<kDType, kHeadDim, kFusedDq, true>::kThreads, 1)
    FlashBackwardDkDvSm90PersistentKernel(const __grid_constant__ BwdKernelArgs args,
                                          const DkDvBlocks blocks) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashBackwardDkDvSm90PersistentCta<kDType, kHeadDim, kFusedDq>(args, blocks);
#else
  __trap();
#endif
}

}  // namespace attnserve::kernels::flash
