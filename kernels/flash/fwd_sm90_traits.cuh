// Compile-time geometry of one Hopper (sm_90a) flash forward kernel (element type x head dim x
// schedule): a producer warpgroup and 64-row consumer warpgroups (two or three per CTA), the
// registers each role keeps, the key-tile size from the heuristic, and the shared-memory layout
// (the Q slots, then the K and V stages, all 128-byte swizzled for wgmma, then the stages'
// mbarriers).
#pragma once

#include "kernels/attention_params.h"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

// kPersistent: the schedule (Sm90ForwardPersistent in tile_config.h), which sets the stages.
template <DType kDType, int kHeadDim_, bool kPersistent_>
struct FwdSm90Traits {
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPersistent = kPersistent_;
  static constexpr bool kLoadsDout = false;  // (the backward's dQ kernel loads dO beside Q)
  static constexpr int kBlockM = Sm90ForwardBlockM(kHeadDim);
  static constexpr int kBlockN = Sm90ForwardBlockN(kHeadDim, kPersistent);
  static constexpr int kStages = Sm90ForwardStages(kHeadDim, kPersistent);
  // Query blocks laid from each sequence's end, the partial block first.
  static constexpr bool kBlocksFromEnd = Sm90ForwardBlocksFromEnd(kHeadDim, kPersistent);
  static constexpr int kQStages = Sm90ForwardQStages(kHeadDim, kPersistent);
  // Loads by TMA (at 256; sm90_tensor_maps.h) or by the producer's cp.async. With TMA
  // one producer thread arrives on a full barrier, which also counts the bytes of its tile.
  static constexpr bool kTma = Sm90ForwardTma(kHeadDim);
  // O stored by TMA where a warp's rows lie inside the sequence (out's tensor map).
  static constexpr bool kTmaStore = Sm90ForwardTmaStore(kHeadDim);
  // The softmax of a key tile under the P V of the tile before (Sm90ForwardSoftmaxUnderPv).
  static constexpr bool kSoftmaxUnderPv = Sm90ForwardSoftmaxUnderPv(kHeadDim, kPersistent);
  // Each consumer warpgroup computes only the key tiles its rows see (at 64).
  static constexpr bool kWarpgroupKeys = Sm90ForwardWarpgroupKeys(kHeadDim);
  // The producer writes each block's place into a notice beside its Q slot (persistent, at 64
  // and 128).
  static constexpr bool kBlockNotices = Sm90ForwardBlockNotices(kHeadDim, kPersistent);
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  // setmaxnreg split of the CTA's register pool: the producer only computes addresses; the
  // consumers get the rest (240 with two of them, 160 with three). The persistent TMA producer
  // (block walk, tensor coordinates and the partial tiles' cp.async) spilled 64-192 bytes at 24
  // registers; at 40 it spills none and the two consumers' 232 suffice. With three consumers
  // 40 would leave them 152 and serialize their wgmma (C7512).
  static constexpr int kProducerRegisters =
      kConsumerWarpgroups == 2 ? (kTma && kPersistent ? 40 : 24) : 32;
  static constexpr int kConsumerRegisters =
      ptx::ConsumerRegisters(kThreads, kProducerThreads, kProducerRegisters);

  static constexpr int kSTiles = kBlockN / 8;     // 8-column tiles of S per warp
  static constexpr int kOTiles = kHeadDim / 8;    // 8-column tiles of O per warp
  static constexpr int kQkSteps = kHeadDim / 16;  // k16 steps of S = Q K^T
  static constexpr int kPvSteps = kBlockN / 16;   // k16 steps of O += P V

  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kQSmemBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKvSmemBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  static constexpr int kTileSmemBytes = kQStages * kQSmemBytes + 2 * kStages * kKvSmemBytes;
  static constexpr int kSmemBytes = Sm90ForwardSmemBytes(kHeadDim, kPersistent);

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kHeadDim % 64 == 0, "head dim: whole 128-byte swizzle rows (64 elements)");
  static_assert(kBlockM % 64 == 0, "block rows: whole 64-row warpgroups");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 64 && kBlockN <= 256,
                "key tile: a wgmma N of 64..256 and whole k16 steps of P V");
  static_assert(kHeadDim <= 256, "P V: one wgmma N of at most 256");
  static_assert(kQSmemBytes % 1024 == 0 && kKvSmemBytes % 1024 == 0,
                "every tile starts 1024-byte aligned (swizzle atoms)");
  static_assert(kSmemBytes == kTileSmemBytes + 1024 + 4 * kStages * 8 + 2 * kQStages * 8 +
                                 (kBlockNotices ? kQStages * kSm90ForwardBlockNoticeBytes : 0),
                "shared memory layout");
  static_assert(ptx::RegisterSplitFits(kThreads, kProducerThreads, kProducerRegisters,
                                       kConsumerRegisters),
                "the register split fits the CTA's register pool (ptx::RegisterPool)");
};

}  // namespace attnserve::kernels::flash
