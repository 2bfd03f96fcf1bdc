// The mbarriers of a ring of shared-memory stages between a producer warpgroup and consumer
// warpgroups (the warp-specialized Hopper kernels): per stage and kind of tile (e.g. K and V) a
// `full` barrier that the producer's threads arrive on once their copies into the stage have
// landed, and an `empty` barrier that every consumer thread arrives on once nothing it issued
// reads the stage any more. Tiles are numbered in load order; tile i uses stage i % kStages for
// the (i / kStages)-th time, and a wait names the phase by its parity, so no waiter may fall a
// whole phase behind (the producer never refills a stage before its empty barrier completed).
// Also the CTA's split into those roles (RunSm90Roles) and a consumer's thread index.
#pragma once

#include <cstdint>

#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"

namespace attnserve::kernels::flash {

template <int kStages, int kKinds>
class Sm90StageBarriers {
 public:
  static constexpr int kBytes = 2 * kKinds * kStages * 8;

  __device__ __forceinline__ explicit Sm90StageBarriers(uint32_t base) : base_(base) {}

  // Thread 0 initializes every barrier; the caller then syncs the CTA.
  __device__ __forceinline__ void Init(int producer_threads, int consumer_threads) const {
    for (int s = 0; s < kStages; ++s) {
      for (int kind = 0; kind < kKinds; ++kind) ptx::MbarrierInit(Full(kind, s), producer_threads);
      for (int kind = 0; kind < kKinds; ++kind) ptx::MbarrierInit(Empty(kind, s), consumer_threads);
    }
    ptx::FenceMbarrierInit();
  }

  // Producer: marks tile i full once this thread's cp.async copies into it completed
  // (cp.async.wait_group). The proxy fence runs here, in the writing thread after its writes
  // completed, so that the consumers' wgmma (async proxy) reads see the cp.async (generic proxy)
  // writes; hence not cp.async.mbarrier.arrive, which signals completion with no thread left to
  // fence.
  __device__ __forceinline__ void Publish(int kind, int i) const {
    ptx::FenceProxyAsyncShared();
    ptx::MbarrierArrive(Full(kind, i));
  }
  // Producer (TMA): tile i's full phase also waits for `bytes` of copies that signal
  // FullBarrier(kind, i); issued before them.
  __device__ __forceinline__ void ExpectBytes(int kind, int i, uint32_t bytes) const {
    ptx::MbarrierExpectTx(Full(kind, i), bytes);
  }
  __device__ __forceinline__ uint32_t FullBarrier(int kind, int i) const { return Full(kind, i); }
  // Producer (TMA): this thread's arrival on tile i's full barrier, with no proxy fence (TMA
  // writes are async-proxy writes, and their bytes complete the phase as they land).
  __device__ __forceinline__ void Arrive(int kind, int i) const {
    ptx::MbarrierArrive(Full(kind, i));
  }
  // Producer: waits until the consumers released tile i - kStages, before refilling its stage.
  __device__ __forceinline__ void WaitEmpty(int kind, int i) const {
    ptx::MbarrierWait(Empty(kind, i), Parity(i) ^ 1);
  }
  // Consumer: waits until tile i has landed.
  __device__ __forceinline__ void WaitFull(int kind, int i) const {
    ptx::MbarrierWait(Full(kind, i), Parity(i));
  }
  // Consumer: this thread's wgmma reading tile i are complete.
  __device__ __forceinline__ void Release(int kind, int i) const {
    ptx::MbarrierArrive(Empty(kind, i));
  }

 private:
  __device__ __forceinline__ uint32_t Full(int kind, int i) const {
    return base_ + (kind * kStages + i % kStages) * 8;
  }
  __device__ __forceinline__ uint32_t Empty(int kind, int i) const {
    return base_ + ((kKinds + kind) * kStages + i % kStages) * 8;
  }
  __device__ __forceinline__ static uint32_t Parity(int i) { return (i / kStages) & 1; }

  uint32_t base_;
};

// A warp-specialized CTA (T: kProducerThreads, kConsumerThreads and the setmaxnreg split of
// ptx::RegisterPool): thread 0 initializes the stage barriers; then warpgroup 0 gives registers
// back and runs produce() while the consumer warpgroups claim the rest of the pool and run
// consume(their index among the consumers, warp-uniform).
template <class T, class Barriers, class Produce, class Consume>
__device__ __forceinline__ void RunSm90Roles(const Barriers& barriers, Produce&& produce,
                                             Consume&& consume) {
  if (threadIdx.x == 0) barriers.Init(T::kProducerThreads, T::kConsumerThreads);
  __syncthreads();
  const int warpgroup = ptx::WarpUniformWarpgroup();
  if (warpgroup == 0) {
    ptx::ReleaseRegisters<T::kProducerRegisters>();
    produce();
    return;
  }
  ptx::ClaimRegisters<T::kConsumerRegisters>();
  consume(warpgroup - 1);
}

// This thread among the consumers (the producer warpgroup comes first), read afresh
// (ptx::FreshThreadIdx) so that no register holds it through a loop.
template <class T>
__device__ __forceinline__ int Sm90ConsumerThread() {
  return ptx::FreshThreadIdx() - T::kProducerThreads;
}

}  // namespace attnserve::kernels::flash
