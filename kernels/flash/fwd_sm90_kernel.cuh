// The Hopper (sm_90a) flash forward: FlashAttention-2's algorithm on warpgroup MMA, warp
// specialized, persistent on short sequences (Sm90ForwardPersistent): at most one CTA per SM,
// each running query blocks (query block, head, sequence) one after another; else one CTA per
// query block. A producer warpgroup streams Q, K and V into shared-memory slots and a ring of
// stages (fwd_sm90_ring.cuh) and a consumer warpgroup per 64 query rows (two or three) computes;
// a CTA's next block's tiles load while its current one finishes. Tiles are in wgmma's
// 128-byte-swizzled layout, filled with cp.async at head dims 64 / 128 (zero-fill past the
// sequence and in the head-dim padding, so varlen needs no tensor maps) and by TMA at 256
// (fwd_sm90_tma_producer.cuh; Sm90ForwardTma, tuning.h's ATTN_FLASH_SM90_FWD_TMA). Per key
// tile each consumer computes S = Q K^T (wgmma, both operands from shared memory), masks and
// runs the online softmax in registers, and adds P V (wgmma, P from registers, V N-major from
// shared memory); at head dims 128 (one CTA per block) and 256 the P V of one tile runs under
// the softmax of the next (Sm90ForwardSoftmaxUnderPv), and with the ping-pong schedule, whose
// turns run on from block to block, one consumer's GEMMs run under the other's softmax and
// epilogue, which stores O by TMA at head dims 128 and 256 (Sm90ForwardTmaStore). Key tiles
// are visited last to first, with the sm80 kernel's block location (fwd_block.cuh; at head dim
// 64 and at 256 with one CTA per block the blocks are laid from the sequence's end:
// Sm90ForwardBlocksFromEnd) and row-tile math (masks, online softmax: fwd_row_tile.cuh), so both
// paths see exactly the same keys.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_row_tile.cuh"
#include "kernels/flash/fwd_sm90_ring.cuh"
#include "kernels/flash/fwd_sm90_tma_producer.cuh"
#include "kernels/flash/fwd_sm90_traits.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"
#include "kernels/flash/sm90_tensor_maps.h"
#include "kernels/flash/sm90_tile_products.cuh"
#include "kernels/flash/tuning.h"

namespace attnserve::kernels::flash {

// One consumer warpgroup's share of a block: its 64 query rows against every key tile.
template <DType kDType, int kHeadDim, bool kPersistent>
class FwdSm90BlockRunner {
  using T = FwdSm90Traits<kDType, kHeadDim, kPersistent>;
  using Ring = FwdSm90Ring<T>;
  // Ping-pong between the consumer warpgroups (FlashAttention-3): each issues its GEMMs of a
  // tile only in its turn and passes the turn on once they are issued, so one warpgroup's softmax
  // runs under the other's GEMMs instead of all of them competing for the tensor cores at once
  // (+5 to +20% at head dim 64 against no turns: NOTES.md "Tuning knobs").
  // Named barrier of warpgroup w's turn: 1 + w (0 is __syncthreads'), between w (bar.sync) and
  // the warpgroup before it (bar.arrive).
  static constexpr int kTurnBarrier = 1;
  using Element = typename T::Element;
  using Mma = ptx::Wgmma<Element, T::kBlockN>;    // S = Q K^T: 64 x kBlockN per warpgroup
  using MmaPv = ptx::Wgmma<Element, kHeadDim>;    // O += P V: 64 x kHeadDim per warpgroup

 public:
  // The turns run on from block to block: the last warpgroup hands the CTA's first to
  // warpgroup 0, which takes the last one's final pass once the CTA's blocks are done, so that
  // no arrival is left on a barrier when the CTA exits.
  __device__ __forceinline__ static void StartTurns(int warpgroup) {
    if (warpgroup == T::kConsumerWarpgroups - 1) ptx::NamedBarrierArrive<256>(kTurnBarrier);
  }
  __device__ __forceinline__ static void EndTurns(int warpgroup) {
    if (warpgroup == 0) ptx::NamedBarrierSync<256>(kTurnBarrier);
  }

  // The block is the CTA's q_index-th that sees keys (its Q slot); its key tiles have load-order
  // numbers from first_tile on.
  __device__ __forceinline__ FwdSm90BlockRunner(const FwdKernelArgs& args, const FwdBlock& block,
                                                const Ring& ring, int warpgroup, int q_index,
                                                int first_tile)
      : args_(args),
        block_(block),
        ring_(ring),
        q_smem_(ring.Q(q_index)),
        warpgroup_(warpgroup),
        q_index_(q_index),
        first_tile_(first_tile) {
    vecs_valid_ = args.head_dim / T::kVecElems;
  }

  // Software-pipelined over key tiles: iteration n issues S(n) = Q K(n)^T and then
  // O += P(n+1) V(n+1) on the tensor cores, waits for S(n) only, and runs the softmax of tile n,
  // under the P V where T::kSoftmaxUnderPv (FlashAttention-3's intra-warpgroup overlap); O is
  // rescaled once P V is done.
  // Each stage is handed back to the producer as soon as this warpgroup's wgmma reading it is
  // complete. With T::kWarpgroupKeys (head dim 64), the block's key tiles that none of this
  // warpgroup's rows see are passed over (PassOver), before and after its own.
  __device__ __forceinline__ void Run() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max_[h] = -INFINITY;
      row_sum_[h] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < T::kOTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_[nt][e] = 0.0f;
    }
    uint32_t p[T::kPvSteps][4];  // P(n+1), the A operand of the P V in flight
    int n = block_.n_end - 1;
    int i = first_tile_;
    KeyTiles own{block_.n_begin, block_.n_end};
    if constexpr (T::kWarpgroupKeys) {
      own = BlockRowsKeyTiles<T::kBlockN>(args_, block_, warpgroup_ * 64, 64);
      for (; n >= own.n_end; --n, ++i) PassOver(n, i);
    }
    if (!T::kWarpgroupKeys || own.n_begin < own.n_end) {
      // The last tile (no P V before it) is peeled off, so that whether a P V is in flight is
      // known at compile time everywhere: with a run-time flag ptxas cannot prove that O is not
      // rescaled under a running P V and serializes every wgmma (C7515).
      if (n >= block_.mask_from || n < block_.mask_below) {
        Step<true, false>(n, i, p);
      } else {
        Step<false, false>(n, i, p);
      }
      for (--n, ++i; n >= own.n_begin; --n, ++i) {
        if (n >= block_.mask_from || n < block_.mask_below) {
          Step<true, true>(n, i, p);
        } else {
          Step<false, true>(n, i, p);
        }
      }
      // The first key tile's P V.
      ring_.WaitFull(Ring::kV, i - 1);
      ptx::WgmmaFence();
      IssuePV(p, ring_.V(i - 1));
      ptx::WgmmaWait<0>(o_);
      ring_.Release(Ring::kV, i - 1);  // the stage's next tile may be the next block's
    }
    if constexpr (T::kWarpgroupKeys) {
      for (; n >= block_.n_begin; --n, ++i) PassOver(n, i);
    }
  }

  // Normalizes O and writes each warp's 16 rows through its own rows of the Q slot (no wgmma
  // reads them any more): with a TMA store where they lie inside the sequence (T::kTmaStore),
  // else with the warp's 16-byte stores; and their lse. Then hands the slot back.
  // place: the block's FwdCta, or its FwdBlockNotice (fwd_sm90_ring.cuh); only its q_row and
  // head are read.
  template <class Place, class Maps>
  __device__ __forceinline__ void Epilogue(const Place& place, const Maps& maps) {
    const int tid = Sm90ConsumerThread<T>();
    const int warp = tid / 32;
    const int lane = tid % 32;
    // out and lse found again from the block's row and head: two registers held through the
    // key tiles rather than cta.out's and cta.lse's four (at head dim 64 the three consumer
    // warpgroups' 160 registers spilled with them beside the TMA store's coordinates).
    float* lse = ForwardLseRow(args_, place.q_row, place.head);
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = QuadRowSum(row_sum_[h]);
      inv[h] = RowNormalizer(sum);
      const int row = warp * 16 + lane / 4 + 8 * h;
      if (lane % 4 == 0 && row < block_.rows_valid) {
        lse[row] = RowLse(sum, row_max_[h], args_.lse_scale);
      }
    }
    if (T::kTmaStore && (warp + 1) * 16 <= block_.rows_valid) {
      if constexpr (T::kTmaStore) StoreWarpRowsByTma(place, maps, inv, warp, lane);
    } else {
      StoreWarpRowsThroughTile<T::kBlockM, T::kRowVecs>(
          q_smem_, o_, inv, ForwardOutRow<Element>(args_, place.q_row, place.head),
          args_.q_row_stride, block_.rows_valid, vecs_valid_, warp, lane);
    }
    // The slot's next Q comes by TMA, an async-proxy write after these generic ones.
    if constexpr (T::kTma) ptx::FenceProxyAsyncShared();
    ring_.ReleaseQ(q_index_);
  }

 private:
  // The warp's rows written into the Q slot, fenced for the async proxy the TMA store reads
  // through, and stored by lane 0 with one box per 64 head-dim columns; returns once the boxes
  // have been read (the slot may be refilled then). Columns past head_dim are not written.
  template <class Place, class Maps>
  __device__ __forceinline__ void StoreWarpRowsByTma(const Place& place, const Maps& maps,
                                                     const float (&inv)[2], int warp, int lane) {
    WriteWarpRowsToTile<T::kBlockM, Element>(q_smem_, o_, inv, warp, lane);
    ptx::FenceProxyAsyncShared();
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int b = 0; b < kHeadDim / 64; ++b) {
        ptx::TmaStore3d(&maps.out, b * 64, place.head, place.q_row + warp * 16,
                        q_smem_ + b * T::kBlockM * 128 + warp * 16 * 128);
      }
      ptx::BulkCommitGroup();
      ptx::BulkWaitGroupRead<0>();
    }
    __syncwarp();
  }

  // Key tile n (load-order index i): S(n) and (unless n is the last tile) P(n+1) V(n+1) on the
  // tensor cores, the softmax of S(n) under the P V, then O rescaled and P(n) packed for the
  // next iteration.
  template <bool kMask, bool kPv>
  __device__ __forceinline__ void Step(int n, int i, uint32_t (&p)[T::kPvSteps][4]) {
    // V(i - 1) is published before K(i), so waiting for it here costs nothing; a wait between
    // the two GEMMs would make ptxas re-fence the registers of the second (C7519).
    ring_.WaitFull(Ring::kK, i);
    if constexpr (kPv) ring_.WaitFull(Ring::kV, i - 1);
    ptx::NamedBarrierSync<256>(kTurnBarrier + warpgroup_);
    float s[T::kSTiles][4];
    ptx::WgmmaFence();
    IssueScores(s, ring_.K(i));
    if constexpr (kPv) IssuePV(p, ring_.V(i - 1));
    PassTurn();
    ptx::WgmmaWait<kPv ? 1 : 0>(s);
    ring_.Release(Ring::kK, i);
    if (args_.softcap) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = ptx::Tanh(s[nt][e] * args_.softcap_input_scale);
      }
    }
    if constexpr (kMask) ApplyMask(s, n);
    float correction[2];
    const bool any_new_max = UpdateSoftmax(s, correction);
    if constexpr (kPv && T::kSoftmaxUnderPv) {
      // ptxas schedules a wgmma wait early in its basic block, above independent arithmetic
      // (the softmax waited for the P V that way), so the softmax is pinned above a branch and
      // the wait is in both of its arms. Every warp of the warpgroup must run the same wait
      // (.aligned): the branch is on a launch argument.
      ptx::PinRegisters(s);
      if (args_.softcap) {
        WaitPV(i);
      } else {
        WaitPV(i);
      }
    } else if constexpr (kPv) {
      WaitPV(i);
    }
    if (__any_sync(0xffffffffu, any_new_max)) RescaleO(correction);
    // P(n) as 16-bit A fragments, one per k16 step.
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) PackPStep<Element>(s, kk, p[kk]);
  }

  // The P V of tile i - 1 done: its V stage goes back to the producer.
  __device__ __forceinline__ void WaitPV(int i) {
    ptx::WgmmaWait<0>(o_);
    ring_.Release(Ring::kV, i - 1);
  }

  __device__ __forceinline__ void RescaleO(const float (&correction)[2]) {
#pragma unroll
    for (int nt = 0; nt < T::kOTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_[nt][e] *= correction[e / 2];
    }
  }

  // Key tile n (load-order index i), which none of this warpgroup's rows see: its turn taken
  // and passed on at once, and its K and V stages released once they landed (a release before
  // the tile is there could complete the stage's previous phase for a warpgroup still reading
  // it). Q has landed with the block's first K tile, before the epilogue writes O over it.
  __device__ __forceinline__ void PassOver(int n, int i) {
    ptx::NamedBarrierSync<256>(kTurnBarrier + warpgroup_);
    PassTurn();
    ring_.WaitFull(Ring::kK, i);
    ring_.Release(Ring::kK, i);
    ring_.WaitFull(Ring::kV, i);
    ring_.Release(Ring::kV, i);
  }

  // The turn goes to the next warpgroup, the last one's to warpgroup 0, also at the end of a
  // block: its next block's first GEMMs then run under the others' last softmax and epilogue.
  __device__ __forceinline__ void PassTurn() {
    ptx::NamedBarrierArrive<256>(kTurnBarrier + (warpgroup_ + 1) % T::kConsumerWarpgroups);
  }

  // S = Q K^T with the K tile at `k` (sm90_tile_products.cuh; the caller fences first).
  __device__ __forceinline__ void IssueScores(float (&s)[T::kSTiles][4], uint32_t k) {
    IssueRowProducts<Mma, T::kBlockM, T::kBlockN, T::kQkSteps>(s, q_smem_ + warpgroup_ * 64 * 128,
                                                               k);
  }

  // O += P V with the V tile at `v` as the N-major operand (the caller fences first).
  __device__ __forceinline__ void IssuePV(const uint32_t (&p)[T::kPvSteps][4], uint32_t v) {
    IssueFragmentProducts<MmaPv, T::kBlockN>(o_, p, v);
  }

  // Masks this warp's 16-row tile (fwd_row_tile.cuh) of key tile n.
  __device__ __forceinline__ void ApplyMask(float (&s)[T::kSTiles][4], int n) {
    const int tid = Sm90ConsumerThread<T>();
    const int warp = tid / 32;
    const int group = tid % 32 / 4;
    const int first_col = n * T::kBlockN + 2 * (tid % 4);
    MaskRowTile(s, block_.diagonal + warp * 16 + group, first_col, block_.len_k, args_);
  }

  // Online softmax of this warp's 16-row tile (fwd_row_tile.cuh). Returns whether some row of
  // this thread has a new maximum, with the factors O must be rescaled by (the caller does that
  // once the P V in flight is done).
  __device__ __forceinline__ bool UpdateSoftmax(float (&s)[T::kSTiles][4],
                                                float (&correction)[2]) {
    const float scale = args_.exp2_scale;
    float shift[2];
    bool any_new_max = false;
    UpdateRowMax(s, row_max_, scale, shift, correction, any_new_max);
    ExponentiateRows(s, shift, correction, scale, row_sum_);
    return any_new_max;
  }

  const FwdKernelArgs& args_;
  const FwdBlock& block_;
  const Ring& ring_;
  uint32_t q_smem_;
  int warpgroup_;  // among the consumers; warp-uniform (from lane 0), so branches on it are too
  int q_index_;
  int first_tile_;
  int vecs_valid_;
  // Per thread: rows (group, group + 8) of its warp's 16; O columns 8 nt + 2 quad_lane + {0, 1}.
  float o_[T::kOTiles][4];
  float row_max_[2];
  float row_sum_[2];
};

// The producer of T's loads: TMA with the tensor maps, or cp.async.
template <class T>
__device__ __forceinline__ auto MakeFwdSm90Producer(const FwdKernelArgs& args,
                                                    const FwdSm90Maps<T::kTma, T::kTmaStore>& maps,
                                                    const FwdSm90Ring<T>& ring) {
  if constexpr (T::kTma) {
    return FwdSm90TmaProducer<T>(args, maps.loads, ring);
  } else {
    return FwdSm90Producer<T>(args, ring);
  }
}

// The tensor maps a head dim's kernels take.
template <int kHeadDim>
using FwdSm90MapsAt = FwdSm90Maps<Sm90ForwardTma(kHeadDim), Sm90ForwardTmaStore(kHeadDim)>;

// One CTA per query block: this CTA's (BeginForwardCta).
template <DType kDType, int kHeadDim>
__device__ __forceinline__ void FlashForwardSm90BlockCta(
    const FwdKernelArgs& args, const FwdSm90MapsAt<kHeadDim>& maps) {
  using T = FwdSm90Traits<kDType, kHeadDim, false>;
  extern __shared__ __align__(16) unsigned char smem[];
  FwdCta<typename T::Element> cta;
  if (!BeginForwardCta<T::kBlockM, T::kBlockN, T::kRowVecs, T::kThreads,
                       T::kBlocksFromEnd>(args, cta)) {
    return;
  }
  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const FwdSm90Ring<T> ring((ptx::SharedAddress(smem) + 1023u) & ~1023u);
  RunSm90Roles<T>(
      ring,
      [&] {
        auto producer = MakeFwdSm90Producer<T>(args, maps, ring);
        producer.Block(cta);
        producer.Finish();
      },
      [&](int consumer) {
        using Runner = FwdSm90BlockRunner<kDType, kHeadDim, false>;
        Runner::StartTurns(consumer);
        Runner runner(args, cta.block, ring, consumer, 0, 0);
        runner.Run();
        runner.Epilogue(cta, maps);
        Runner::EndTurns(consumer);
      });
}

// Persistent: this CTA's blocks one after another (ForEachForwardBlock; the consumers read them
// from the producer's notices with T::kBlockNotices), the Q slots and the K/V ring's tile
// numbers running on from block to block.
template <DType kDType, int kHeadDim>
__device__ __forceinline__ void FlashForwardSm90PersistentCta(
    const FwdKernelArgs& args, const FwdSm90Grid& grid,
    const FwdSm90MapsAt<kHeadDim>& maps) {
  using T = FwdSm90Traits<kDType, kHeadDim, true>;
  extern __shared__ __align__(16) unsigned char smem[];
  const FwdSm90Ring<T> ring((ptx::SharedAddress(smem) + 1023u) & ~1023u);
  RunSm90Roles<T>(
      ring,
      [&] {
        auto producer = MakeFwdSm90Producer<T>(args, maps, ring);
        ForEachForwardBlock<T>(args, grid, [&](const auto& cta) { producer.Block(cta); });
        producer.Finish();
      },
      [&](int consumer) {
        using Runner = FwdSm90BlockRunner<kDType, kHeadDim, true>;
        int q_index = 0;
        int first_tile = 0;
        Runner::StartTurns(consumer);
        const auto run_block = [&](const auto& cta) {
          if (SeesNoKeys(cta.block)) return;  // the producer writes its answer
          Runner runner(args, cta.block, ring, consumer, q_index, first_tile);
          runner.Run();
          runner.Epilogue(cta, maps);
          ++q_index;
          first_tile += cta.block.n_end - cta.block.n_begin;
        };
        if constexpr (T::kBlockNotices) {
          ForEachNoticedBlock<T>(ring, run_block);
        } else {
          ForEachForwardBlock<T>(args, grid, run_block);
        }
        Runner::EndTurns(consumer);
      });
}

// Compiled only in sm_90a code (the instantiation files are built for that target alone); any
// other pass sees a trap, never launched.
template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(FwdSm90Traits<kDType, kHeadDim, false>::kThreads, 1)
    FlashForwardSm90Kernel(const __grid_constant__ FwdKernelArgs args,
                           const __grid_constant__ FwdSm90MapsAt<kHeadDim> maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashForwardSm90BlockCta<kDType, kHeadDim>(args, maps);
#else
  __trap();
#endif
}

template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(FwdSm90Traits<kDType, kHeadDim, true>::kThreads, 1)
    FlashForwardSm90PersistentKernel(const __grid_constant__ FwdKernelArgs args,
                                     const FwdSm90Grid grid,
                                     const __grid_constant__ FwdSm90MapsAt<kHeadDim> maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashForwardSm90PersistentCta<kDType, kHeadDim>(args, grid, maps);
#else
  __trap();
#endif
}

}  // namespace attnserve::kernels::flash
