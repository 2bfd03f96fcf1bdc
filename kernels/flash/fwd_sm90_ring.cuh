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
#include "kernels/flash/sm90_stage_barriers.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"

namespace attnserve::kernels::flash {

// Stage addresses and their barriers (sm90_stage_barriers.cuh; kind 0 is K, 1 is V). Key tiles
// are numbered in load order, i = 0 for the block's last tile (the consumers visit keys last to
// first).
template <class T>
class FwdSm90Ring : public Sm90StageBarriers<T::kStages, 2> {
 public:
  static constexpr int kK = 0;
  static constexpr int kV = 1;

  __device__ __forceinline__ explicit FwdSm90Ring(uint32_t tiles)
      : Sm90StageBarriers<T::kStages, 2>(tiles + 2 * T::kStages * T::kKvSmemBytes),
        tiles_(tiles) {}

  __device__ __forceinline__ uint32_t K(int i) const {
    return tiles_ + (i % T::kStages) * T::kKvSmemBytes;
  }
  __device__ __forceinline__ uint32_t V(int i) const {
    return tiles_ + (T::kStages + i % T::kStages) * T::kKvSmemBytes;
  }

 private:
  uint32_t tiles_;
};

// The producer warpgroup's whole work: Q with the first K tile, then K and V of every key tile
// into the ring. A stage is refilled once the consumers released its previous tile; each tile is
// published once this thread's copies of it landed (Sm90StageBarriers::Publish). One group stays
// in flight while the previous one is waited for.
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
  LoadSwizzledAsync<T::kBlockM, T::kRowVecs, T::kProducerThreads>(
      q_smem, q, static_cast<int>(args.q_row_stride), block.rows_valid, vecs_valid, tid);
  using Ring = FwdSm90Ring<T>;
  const int tiles = block.n_end - block.n_begin;
  for (int i = 0; i < tiles; ++i) {
    const int n = block.n_end - 1 - i;
    if (i >= T::kStages) ring.WaitEmpty(Ring::kK, i);
    load(ring.K(i), args.k, n);
    ptx::CommitAsyncGroup<Sm80>();
    if (i > 0) {
      ptx::WaitAsyncGroups<Sm80, 1>();  // V(i - 1) landed
      ring.Publish(Ring::kV, i - 1);
    }
    if (i >= T::kStages) ring.WaitEmpty(Ring::kV, i);
    load(ring.V(i), args.v, n);
    ptx::CommitAsyncGroup<Sm80>();
    ptx::WaitAsyncGroups<Sm80, 1>();  // K(i) (and Q with the first) landed
    ring.Publish(Ring::kK, i);
  }
  ptx::WaitAsyncGroups<Sm80, 0>();
  ring.Publish(Ring::kV, tiles - 1);
}

}  // namespace attnserve::kernels::flash
