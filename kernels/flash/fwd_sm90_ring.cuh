// The Hopper (sm_90a) forward's warp specialization: a producer warpgroup streams Q and the key
// tiles' K and V into a ring of shared-memory stages while the consumer warpgroups
// (fwd_sm90_kernel.cuh) compute; per stage and tensor a `full` mbarrier says the tile has landed
// and an `empty` one that every consumer is done reading it. No CTA barrier is left in the
// main loop, so the consumers drift against each other and against the loads (FlashAttention-3's
// structure, with cp.async in place of TMA: zero-fill past a sequence's end needs no tensor map
// per sequence).
#pragma once

#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_sm90_traits.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"

namespace attnserve::kernels::flash {

// Stage addresses and mbarriers. Key tiles are numbered in load order, i = 0 for the block's
// last tile (the consumers visit keys last to first); tile i uses stage i % kStages, for the
// (i / kStages)-th time.
template <class T>
class FwdSm90Ring {
 public:
  __device__ __forceinline__ explicit FwdSm90Ring(uint32_t tiles)
      : tiles_(tiles), barriers_(tiles + 2 * T::kStages * T::kKvSmemBytes) {}

  // Thread 0 initializes every barrier; the caller then fences and syncs the CTA.
  __device__ __forceinline__ void Init() const {
    for (int s = 0; s < T::kStages; ++s) {
      ptx::MbarrierInit(FullK(s), T::kProducerThreads);
      ptx::MbarrierInit(FullV(s), T::kProducerThreads);
      ptx::MbarrierInit(EmptyK(s), T::kConsumerThreads);
      ptx::MbarrierInit(EmptyV(s), T::kConsumerThreads);
    }
    ptx::FenceMbarrierInit();
  }

  __device__ __forceinline__ uint32_t K(int i) const {
    return tiles_ + (i % T::kStages) * T::kKvSmemBytes;
  }
  __device__ __forceinline__ uint32_t V(int i) const {
    return tiles_ + (T::kStages + i % T::kStages) * T::kKvSmemBytes;
  }
  __device__ __forceinline__ uint32_t FullK(int i) const { return Barrier(0, i); }
  __device__ __forceinline__ uint32_t FullV(int i) const { return Barrier(1, i); }
  __device__ __forceinline__ uint32_t EmptyK(int i) const { return Barrier(2, i); }
  __device__ __forceinline__ uint32_t EmptyV(int i) const { return Barrier(3, i); }

  // The parity of the barrier phase that tile i's use of its stage completes.
  __device__ __forceinline__ static uint32_t Parity(int i) { return (i / T::kStages) & 1; }

 private:
  __device__ __forceinline__ uint32_t Barrier(int kind, int i) const {
    return barriers_ + (kind * T::kStages + i % T::kStages) * 8;
  }

  uint32_t tiles_;
  uint32_t barriers_;
};

// The producer warpgroup's whole work: Q with the first K tile, then K and V of every key tile
// into the ring. A stage is refilled once the empty barrier of its previous tile completed. Each
// producer thread marks a tile full after its own copies of it completed (cp.async.wait_group)
// and after a proxy fence, so that the consumers' wgmma (async proxy) reads see the cp.async
// (generic proxy) writes: the fence has to follow the completed writes in the writing thread,
// which is why this is not cp.async.mbarrier.arrive (that signals completion with no thread left
// to fence). One group stays in flight while the previous one is waited for.
template <class T>
__device__ __forceinline__ void ProduceTiles(const FwdKernelArgs& args, const FwdBlock& block,
                                             int64_t kv_offset, const typename T::Element* q,
                                             uint32_t q_smem, const FwdSm90Ring<T>& ring,
                                             int tid) {
  using Element = typename T::Element;
  const int vecs_valid = args.head_dim / T::kVecElems;
  const int row_stride = static_cast<int>(args.kv_row_stride);
  const auto load = [&](uint32_t smem, const void* tensor, int n) {
    const int first_key = n * T::kBlockN;
    const Element* src = static_cast<const Element*>(tensor) + kv_offset +
                         int64_t{first_key} * args.kv_row_stride;
    LoadSwizzledAsync<T::kBlockN, T::kRowVecs, T::kProducerThreads>(
        smem, src, row_stride, block.len_k - first_key, vecs_valid, tid);
  };
  const auto publish = [&](uint32_t full) {
    ptx::FenceProxyAsyncShared();
    ptx::MbarrierArrive(full);
  };

  LoadSwizzledAsync<T::kBlockM, T::kRowVecs, T::kProducerThreads>(
      q_smem, q, static_cast<int>(args.q_row_stride), block.rows_valid, vecs_valid, tid);
  const int tiles = block.n_end - block.n_begin;
  for (int i = 0; i < tiles; ++i) {
    const int n = block.n_end - 1 - i;
    const uint32_t reuse_parity = FwdSm90Ring<T>::Parity(i) ^ 1;  // tile i - kStages's phase
    if (i >= T::kStages) ptx::MbarrierWait(ring.EmptyK(i), reuse_parity);
    load(ring.K(i), args.k, n);
    ptx::CommitAsyncGroup<Sm80>();
    if (i > 0) {
      ptx::WaitAsyncGroups<Sm80, 1>();  // V(i - 1) landed
      publish(ring.FullV(i - 1));
    }
    if (i >= T::kStages) ptx::MbarrierWait(ring.EmptyV(i), reuse_parity);
    load(ring.V(i), args.v, n);
    ptx::CommitAsyncGroup<Sm80>();
    ptx::WaitAsyncGroups<Sm80, 1>();  // K(i) (and Q with the first) landed
    publish(ring.FullK(i));
  }
  ptx::WaitAsyncGroups<Sm80, 0>();
  publish(ring.FullV(tiles - 1));
}

}  // namespace attnserve::kernels::flash
