// The Hopper forward's producer with TMA (at 256: Sm90ForwardTma in tile_config.h): the same ring,
// tile order and Q slots as FwdSm90Producer (fwd_sm90_ring.cuh), but one thread issues each
// tile as TMA boxes of 64 head-dim columns (sm90_tensor_maps.h) and arrives on its full barrier
// with the tile's bytes expected, so the phase completes as the bytes land; no copy groups to
// wait for. Q goes onto its block's first K tile's barrier, as before. The tile holding a
// sequence's last key, where the keys end inside it, is loaded with cp.async by all 128
// threads instead: its rows past the sequence must be zeros, or a NaN or infinity in the next
// sequence's V would reach O through P = 0 times V.
#pragma once

#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_sm90_ring.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_tensor_maps.h"

namespace attnserve::kernels::flash {

template <class T>
class FwdSm90TmaProducer {
  static_assert(!T::kBlockNotices, "block notices come with the cp.async producer only");
  using Element = typename T::Element;
  using Ring = FwdSm90Ring<T>;
  // Named barrier of the producer warpgroup's 128 threads around their cp.async copies of a
  // partial tile (the consumers' turns take 1 to 3).
  static constexpr int kCopiesBarrier = 15;

 public:
  __device__ __forceinline__ FwdSm90TmaProducer(const FwdKernelArgs& args,
                                                const FwdSm90TmaMaps& maps, const Ring& ring)
      : args_(args), maps_(maps), ring_(ring) {}

  __device__ __forceinline__ void Block(const FwdCta<Element>& cta) {
    if (WroteKeylessBlock<T>(args_, cta)) return;
    const int tiles = cta.block.n_end - cta.block.n_begin;
    for (int j = 0; j < tiles; ++j) {
      const int i = next_tile_ + j;
      const int n = cta.block.n_end - 1 - j;
      const bool partial = (n + 1) * T::kBlockN > cta.block.len_k;
      if (Leader() && i >= T::kStages) ring_.WaitEmpty(Ring::kK, i);
      LoadKeyTile(Ring::kK, ring_.K(i), &maps_.k, args_.k, cta, n, i, partial);
      if (j == 0 && Leader()) {
        // The slot is free once the consumers finished the block it held, whose tiles are all
        // issued already.
        if (next_q_ >= T::kQStages) ring_.WaitQEmpty(next_q_);
        ring_.ExpectBytes(Ring::kK, i, T::kQSmemBytes);
        LoadHeadBlocks<T::kBlockM>(ring_.Q(next_q_), &maps_.q, cta.q_row, cta.head,
                                   ring_.FullBarrier(Ring::kK, i));
      }
      PublishKeyTile(Ring::kK, i, partial);
      if (Leader() && i >= T::kStages) ring_.WaitEmpty(Ring::kV, i);
      LoadKeyTile(Ring::kV, ring_.V(i), &maps_.v, args_.v, cta, n, i, partial);
      PublishKeyTile(Ring::kV, i, partial);
    }
    next_tile_ += tiles;
    ++next_q_;
  }

  // Every tile was published as it was issued.
  __device__ __forceinline__ void Finish() {}

 private:
  __device__ __forceinline__ static bool Leader() { return ptx::FreshThreadIdx() == 0; }

  // kRows rows of one head from row `row` on, every 64-column block of the head dim, into the
  // tile at `smem` (sm90_swizzled_tile.cuh's layout), signalling `bar`.
  template <int kRows>
  __device__ __forceinline__ void LoadHeadBlocks(uint32_t smem, const CUtensorMap* map,
                                                 int row, int head, uint32_t bar) const {
#pragma unroll
    for (int b = 0; b < T::kHeadDim / 64; ++b) {
      ptx::TmaLoad3d(smem + b * kRows * 128, map, b * 64, head, row, bar);
    }
  }

  // Key tile n (load-order index i) of K or V, once the leader saw its stage empty: TMA, or
  // cp.async where it is partial. Only the leader waits on mbarriers: the other threads copy
  // nothing on most tiles and run ahead, and a thread more than a phase ahead of a barrier
  // would read its parity wrong; for a partial tile they wait for the leader on a named
  // barrier instead.
  __device__ __forceinline__ void LoadKeyTile(int kind, uint32_t smem, const CUtensorMap* map,
                                              const void* tensor, const FwdCta<Element>& cta,
                                              int n, int i, bool partial) const {
    if (partial) {
      SyncProducers();
      LoadKeyTileAsync<T>(smem, tensor, args_, cta, n);
      ptx::CommitAsyncGroup<Sm80>();
    } else if (Leader()) {
      ring_.ExpectBytes(kind, i, T::kKvSmemBytes);
      LoadHeadBlocks<T::kBlockN>(smem, map, cta.k_row + n * T::kBlockN, cta.kv_head,
                                 ring_.FullBarrier(kind, i));
    }
  }

  // The leader's arrival on tile i's full barrier; a partial tile's copies must have landed,
  // been fenced for the async proxy (Sm90StageBarriers::Publish) and all 128 threads be done.
  __device__ __forceinline__ void PublishKeyTile(int kind, int i, bool partial) const {
    if (partial) {
      ptx::WaitAsyncGroups<Sm80, 0>();
      ptx::FenceProxyAsyncShared();
      SyncProducers();
    }
    if (Leader()) ring_.Arrive(kind, i);
  }

  // The 128 producer threads meet; the leader's warp reconverges first (the leader waits and
  // issues alone), as bar.sync (aligned) requires.
  __device__ __forceinline__ static void SyncProducers() {
    __syncwarp();
    ptx::NamedBarrierSync<T::kProducerThreads>(kCopiesBarrier);
  }

  const FwdKernelArgs& args_;
  const FwdSm90TmaMaps& maps_;
  const Ring& ring_;
  int next_tile_ = 0;  // load-order number of the next key tile
  int next_q_ = 0;     // run-order number of the next block that sees keys
};

}  // namespace attnserve::kernels::flash
