// The Hopper (sm_90a) backward dK/dV kernel at head dims 192 and 256 (NOTES.md "Hopper backward
// at head dims 192 and 256"). At 128 keys per CTA (the hdim-64/128 kernel's block) dK + dV would
// be 192-256 floats per thread, so here one CTA takes 64 keys and its two warpgroups split the
// work by role instead of by keys; each holds one of dK, dV for the 64 keys x the whole head dim
// (96 / 128 floats per thread). A producer warpgroup streams the query tiles (64 rows, through
// two cp.async stages in wgmma's 128-byte swizzle, zero-filled past the sequence, handed over on
// mbarriers: the hdim-64/128 kernel's producer). Per query tile:
//   consumer 0                               consumer 1
//   S^T(it) = K Q^T  (SS, 64 x 64, K = d)    dP^T(it) = V dO^T (SS, 64 x 64, K = d)
//   dQ(it-1) = dS K, half the head dim       dQ(it-1), the other half (SS, MN-major: SSTrans)
//   P^T = exp2(S^T c - lse log2 e)           (waits on barrier 1)
//   G = P^T (1 - tanh^2) -> exchange tile
//   (arrives on barrier 1)                   dS^T = G (dP^T - D) -> dS^T tile it % 2
//   dV += P^T dO     (RS, N = d)             dK += dS^T Q      (RS, N = d)
//   dQ(it-1) reductions                      dQ(it-1) reductions
//   ------ loop-top fence.proxy.async + consumer barrier (publishes tile it's dS^T) ------
// Each tile's dQ products are issued in the next tile, straight behind its S^T / dP^T, so that
// the tensor cores have them while consumer 0 computes P^T and consumer 1 waits for G (with
// dQ at the end of its own tile they idled there, behind a barrier before dQ); the bulk
// reductions into the float32 dQ workspace (dQ by tile) run under dV / dK. That takes two dS^T
// tiles; the last tile's dQ follows the loop. P^T and dS^T come out of the 64-key accumulators
// in the RS A-fragment layout (keys as the M side, as in the hdim-64/128 kernel), so neither
// product reads them from shared memory; the exchange tile keeps G in float32 (dS from P
// rounded to 16 bits cost the sm80 role split 5-30x the dq error, NOTES.md "Backward at head
// dims 192 and 256"). The masks, softcap, tile range, GQA sums and the dQ reductions are the
// hdim-64/128 kernel's. The dQ work is the atomic mode's at 192 (kFusedDq): at 256, and in the
// deterministic mode at 192, this kernel computes dK and dV only, with no dQ product, reduction
// or dS^T tile, and the dQ kernel (bwd_sm90_dq_kernel.cuh) computes dQ.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_sm90_block.cuh"
#include "kernels/flash/bwd_sm90_wide_traits.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"

namespace attnserve::kernels::flash {

template <DType kDType, int kHeadDim, bool kFusedDq>
class BwdSm90WideBlockRunner
    : public BwdSm90Block<BwdSm90WideTraits<kDType, kHeadDim, kFusedDq>> {
  using T = BwdSm90WideTraits<kDType, kHeadDim, kFusedDq>;
  using Base = BwdSm90Block<T>;
  using typename Base::Element;
  using typename Base::MmaScores;
  using typename Base::MmaGrad;
  using typename Base::QueryTile;
  using Base::args_, Base::key_first_, Base::iters_, Base::k_smem_, Base::v_smem_,
      Base::ds_smem_;
  using Base::StageSmem, Base::FirstTile, Base::Next, Base::IssueScores, Base::IssueGrad,
      Base::StoreKeyRows, Base::barriers_;
  using MmaDqA = ptx::Wgmma<Element, T::kDqColsA>;  // 64 queries x 64 columns
  using MmaDqB = ptx::Wgmma<Element, T::kDqColsB>;  // 64 queries x 32 columns (192)
  // Named barriers of the 256 consumer threads (0 is __syncthreads'): consumer 0 hands G to
  // consumer 1 on the first; both meet on the second.
  static constexpr int kExchangeBarrier = 1;
  static constexpr int kConsumersBarrier = 2;

 public:
  // Per thread of warp w (of its consumer warpgroup), lane l: S^T / dP^T / dK / dV rows (keys)
  // 16 w + l / 4 (+ 8), columns 8 t + 2 (l % 4) + {0, 1} of 8-column tile t; dQ rows (queries)
  // likewise.
  __device__ __forceinline__ BwdSm90WideBlockRunner(const BwdKernelArgs& args, uint32_t smem,
                                                    int batch, int kv_head, int n_block)
      : Base(args, smem, batch, kv_head, n_block) {
    g_smem_ = ds_smem_ + T::kDsBuffers * T::kDsBytes;
  }

  // The consumers: one query tile per iteration, each issuing the previous tile's dQ products
  // (Step), its stage released once every wgmma of the tile is complete (the end of its Step).
  // Tile it's dS^T tile (buffer it % 2) is published to both consumers by the loop-top fence and
  // barrier of tile it+1, whose dQ products read it while consumer 1 writes tile it+1's into the
  // other buffer; the last tile's dQ follows the loop behind one more fence and barrier. The
  // first tile is a separate instantiation (no dQ), so the wgmma groups in flight at every wait
  // are compile-time facts (no serialization).
  __device__ __forceinline__ void Run() {
    ZeroGrad();
    if (iters_ == 0) return;
    if (Base::f_.softcap) {
      RunTiles<true>();
    } else {
      RunTiles<false>();
    }
  }

  template <bool kSoftcap>
  __device__ __forceinline__ void RunTiles() {
    this->template RunDeferredDqTiles<kConsumersBarrier>(
        [&](int it, QueryTile prev, QueryTile tile, auto has_prev) {
          Step<T::kFusedDq && decltype(has_prev)::value, kSoftcap>(it, prev, tile);
        },
        [&](QueryTile tile) {
          if constexpr (T::kFusedDq) {
            const int tid = Sm90ConsumerThread<T>();
            const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
            Dq(iters_ - 1, tile, warpgroup, tid % 128 / 32, tid % 32 / 4, tid % 4);
          }
        });
  }

  // dV (consumer 0) or dK times softmax_scale (consumer 1) through the V or K buffer (each warp
  // its own 16 rows), then 16-byte stores of the rows that exist.
  __device__ __forceinline__ void Epilogue() {
    if constexpr (T::kFusedDq) this->FinishDqPieces();
    // No wgmma reads K or V any more (dQ of both consumers reads all of K).
    ptx::NamedBarrierSync<T::kConsumerThreads>(kConsumersBarrier);
    const int tid = Sm90ConsumerThread<T>();
    const bool is_dv = tid < 128;
    StoreKeyRows(grad_, is_dv ? 1.0f : args_.grad_scale, is_dv ? v_smem_ : k_smem_,
                 is_dv ? args_.dv : args_.dk, tid % 128 / 32, tid % 32);
  }

 private:
  // Query tile `it` and, kDq (every tile but the first), tile it-1's dQ products: issued
  // straight behind this tile's S^T / dP^T, so the tensor cores run them while consumer 0
  // computes P^T and consumer 1 waits for G; their reductions then run under the dV / dK
  // product. Tile it-1's dS^T tile (buffer (it-1) % 2) was published by the loop-top barrier;
  // consumer 1 writes tile it's into the other buffer, which no wgmma reads any more (tile
  // it-2's dQ products completed before that barrier). The two consumers run the same wgmma
  // instructions on different operands (warpgroup-uniform selects), so only the element-wise
  // math between them branches. Every wgmma of the tile is complete at its end, so the stage can
  // be released and the next loop-top barrier frees the exchange tile.
  template <bool kDq, bool kSoftcap>
  __device__ __forceinline__ void Step(int it, QueryTile prev, QueryTile tile) {
    const int tid = Sm90ConsumerThread<T>();
    // Warp-uniform as far as the compiler can see (broadcast from lane 0).
    const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int warp = tid % 128 / 32;
    const uint32_t q_st = StageSmem(it);
    const uint32_t do_st = q_st + T::kTileBytes;

    // S^T = K Q^T (consumer 0) or dP^T = V dO^T (consumer 1), then dQ of tile it-1.
    float sc[T::kSTiles][4];
    float dq_a[T::kDqColsA / 8][4];
    float dq_b[T::kDqColsB / 8][4];
    ptx::WgmmaFence();
    IssueScores(sc, warpgroup == 0 ? k_smem_ : v_smem_, warpgroup == 0 ? q_st : do_st);
    if constexpr (kDq) {
      IssueDq<MmaDqA>(dq_a, it - 1, T::DqColA(warpgroup));
      IssueDq<MmaDqB>(dq_b, it - 1, T::DqColB(warpgroup));
    }
    // In flight: S^T / dP^T (, dQ A, dQ B of it-1): wait for the scores only.
    ptx::WgmmaWait<kDq ? 2 : 0>(sc);

    uint32_t a[T::kGradSteps][4];
    GradFragments<kSoftcap>(sc, a, it, tile.row0, tid, warpgroup);
    ptx::WgmmaFence();
    IssueGrad(grad_, a, warpgroup == 0 ? do_st : q_st);
    if constexpr (kDq) {
      // In flight, in issue order: dQ A, dQ B (it-1), the gradient product (it).
      ptx::WgmmaWait<2>(dq_a);
      AddDqA(dq_a, warpgroup, warp, tid % 32);
      ptx::WgmmaWait<1>(dq_b);
      AddDqB(dq_b, prev, warpgroup, warp, tid % 32);
    }
    // The gradient product: the stage is released after this wait, and dK / dV are read after
    // it (next tile's product, the epilogue).
    ptx::WgmmaWait<0>(grad_);
  }

  // The element-wise phase of tile it, sc complete: the A fragments of this warpgroup's
  // gradient product, P^T (dV, from S^T, handing G to consumer 1) or dS^T (dK, from dP^T and
  // G; also into the dS^T tile that dQ reads).
  template <bool kSoftcap>
  __device__ __forceinline__ void GradFragments(float (&sc)[T::kSTiles][4],
                                                uint32_t (&a)[T::kGradSteps][4], int it, int row0,
                                                int tid, int warpgroup) {
    const int warp = tid % 128 / 32;
    const int group = tid % 32 / 4;
    const int quad_lane = tid % 4;
    if (warpgroup == 0) {
      float2 lse[T::kSTiles];
      this->LoadStageVector(StageSmem(it), 0, quad_lane, lse);
      this->template ScoresToP<kSoftcap>(sc, a, row0, lse, key_first_ + warp * 16,
                                         group, quad_lane);
      // G (float32) to the exchange tile: one float4 per thread and 8-query tile, 16 bytes
      // apart between consecutive threads (conflict-free); consumer 1's thread of the same
      // index holds dP^T of the same elements and reads them back.
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
        ptx::StoreShared128(g_smem_ + (nt * 128 + tid % 128) * 16,
                            make_uint4(__float_as_uint(sc[nt][0]), __float_as_uint(sc[nt][1]),
                                       __float_as_uint(sc[nt][2]), __float_as_uint(sc[nt][3])));
      }
      ptx::NamedBarrierArrive<T::kConsumerThreads>(kExchangeBarrier);
    } else {
      ptx::NamedBarrierSync<T::kConsumerThreads>(kExchangeBarrier);
      GradToDs(sc, a, it, warp, group, quad_lane);
    }
  }

  // dQ = dS K of the last tile, after the loop, once consumer 1's dS^T rows are published
  // (PublishDs). Two products per consumer (columns DqColA / DqColB, traits), both committed
  // before the first wait so that the reductions of the first run under the second.
  __device__ __forceinline__ void Dq(int it, QueryTile tile, int warpgroup, int warp, int group,
                                     int quad_lane) {
    float dq_a[T::kDqColsA / 8][4];
    float dq_b[T::kDqColsB / 8][4];
    ptx::WgmmaFence();
    IssueDq<MmaDqA>(dq_a, it, T::DqColA(warpgroup));
    IssueDq<MmaDqB>(dq_b, it, T::DqColB(warpgroup));
    ptx::WgmmaWait<1>(dq_a);
    AddDqA(dq_a, warpgroup, warp, group * 4 + quad_lane);
    ptx::WgmmaWait<0>(dq_b);
    AddDqB(dq_b, tile, warpgroup, warp, group * 4 + quad_lane);
  }

  // The two dQ products of query tile `tile` into the workspace, staged into the warp's piece
  // (A's tiles first, then B's) and added with one bulk reduction once B is staged
  // (BwdSm90Block's dQ by tile).
  __device__ __forceinline__ void AddDqA(const float (&dq)[T::kDqColsA / 8][4], int warpgroup,
                                         int warp, int lane) {
    this->AwaitDqStaging(lane);
    this->StageDqTiles(dq, 0, warpgroup * 4 + warp, lane);
  }
  __device__ __forceinline__ void AddDqB(const float (&dq)[T::kDqColsB / 8][4], QueryTile tile,
                                         int warpgroup, int warp, int lane) {
    this->StageDqTiles(dq, T::kDqColsA / 8, warpgroup * 4 + warp, lane);
    this->ReduceDqPiece(tile, warpgroup * 4 + warp, lane);
  }

  // Warpgroup 1: dS^T = G (dP^T - D) with G from the exchange tile: the A fragments of
  // dK += dS^T Q, and the [key][query] tile that dQ reads (DsSmem(it)).
  __device__ __forceinline__ void GradToDs(const float (&dp)[T::kSTiles][4],
                                           uint32_t (&ds)[T::kGradSteps][4], int it, int warp,
                                           int group, int quad_lane) {
    const uint32_t dsum_at =
        StageSmem(it) + 2 * T::kTileBytes + T::kBlockM * 4 + 2 * quad_lane * 4;
    const int key_row = warp * 16 + group;
    const int thread = Sm90ConsumerThread<T>() % 128;
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
      const float2 dsum = ptx::LoadSharedFloat2(dsum_at + nt * 32);
      const uint4 g = ptx::LoadShared128(g_smem_ + (nt * 128 + thread) * 16);
      const float gf[4] = {__uint_as_float(g.x), __uint_as_float(g.y), __uint_as_float(g.z),
                           __uint_as_float(g.w)};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t packed =
            ptx::PackPair<Element>(gf[2 * h] * (dp[nt][2 * h] - dsum.x),
                                   gf[2 * h + 1] * (dp[nt][2 * h + 1] - dsum.y));
        ds[nt / 2][(nt % 2) * 2 + h] = packed;
        if constexpr (T::kFusedDq) {
          ptx::StoreShared32(
              DsSmem(it) + SwizzledOffset<T::kBlockN>(key_row + 8 * h, nt) + quad_lane * 4,
              packed);
        }
      }
    }
  }

  // dQ columns col0.. (64 queries x Mma's N) of tile it = dS K from its dS^T tile, one
  // committed group (BwdSm90Block::IssueDqColumns).
  template <class Mma, int kTiles>
  __device__ __forceinline__ void IssueDq(float (&dq)[kTiles][4], int it, int col0) {
    this->template IssueDqColumns<Mma>(dq, DsSmem(it), col0);
  }

  // Tile it's dS^T tile, one per tile parity, so that tile it+1's can be written while tile
  // it's dQ products read it.
  __device__ __forceinline__ uint32_t DsSmem(int it) const {
    return ds_smem_ + (it % T::kDsBuffers) * T::kDsBytes;
  }

  __device__ __forceinline__ void ZeroGrad() {
#pragma unroll
    for (int nt = 0; nt < T::kDTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) grad_[nt][e] = 0.0f;
    }
  }

  uint32_t g_smem_;  // the exchange tile, after the dS^T tiles
  float grad_[T::kDTiles][4];  // dV (consumer 0) or dK (consumer 1), unscaled
};

template <DType kDType, int kHeadDim, bool kFusedDq>
__device__ __forceinline__ void FlashBackwardDkDvSm90WideCta(const BwdKernelArgs& args) {
  extern __shared__ __align__(16) unsigned char smem[];
  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const uint32_t base = (ptx::SharedAddress(smem) + 1023u) & ~1023u;
  const DkDvCtaCoords cta = HeadsFirstDkDvCta(args.fwd);
  BwdSm90WideBlockRunner<kDType, kHeadDim, kFusedDq> runner(args, base, cta.batch, cta.kv_head,
                                                            cta.n_block);
  if (!runner.Exists()) return;
  RunSm90Roles<BwdSm90WideTraits<kDType, kHeadDim, kFusedDq>>(
      runner.barriers(), [&] { runner.Produce(); },
      [&](int) {
        runner.Run();
        runner.Epilogue();
      });
}

// Compiled only in sm_90a code (the instantiation files are built for that target alone); any
// other pass sees a trap, never launched. The name contains "FlashBackwardDkDvSm90" (the GPU
// test checks that prefix in the profiler's kernel list).
template <DType kDType, int kHeadDim, bool kFusedDq>
__global__ void __launch_bounds__(BwdSm90WideTraits<kDType, kHeadDim, kFusedDq>::kThreads, 1)
    FlashBackwardDkDvSm90WideKernel(const __grid_constant__ BwdKernelArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashBackwardDkDvSm90WideCta<kDType, kHeadDim, kFusedDq>(args);
#else
  __trap();
#endif
}

}  // namespace attnserve::kernels::flash
