// Compile-time geometry of the Hopper (sm_90a) backward's dQ kernel (bwd_sm90_dq_kernel.cuh):
// the forward's warp-specialized shape (a producer warpgroup, two 64-row consumer warpgroups,
// the forward's ring of K/V stages, fwd_sm90_ring.cuh) with one query slot that holds the
// block's Q and dO:
//   Q (128 rows) | dO (128 rows) | stage 0, 1: K (kBlockN rows) | stage 0, 1: V | mbarriers
// every tile 128-byte swizzled for wgmma and 1 KB aligned. At head dim 256 that is 128 + 96 KB:
// 48-key tiles are the most that two stages leave room for. At 64 / 128 / 192 (the deterministic
// mode there) 64-key tiles: 32 + 32 / 64 + 64 / 96 + 96 KB, and dQ (32 / 64 / 96 floats per
// thread) beside S and dP (32 each) fits the consumers' 240 registers. At 192 the producer's
// 128 threads load rows of 24 vectors in the flat order (LoadSwizzledTileAsync).
#pragma once

#include "kernels/attention_params.h"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

template <DType kDType, int kHeadDim_>
struct BwdSm90DqTraits {
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPersistent = false;  // one CTA per query block
  static constexpr bool kLoadsDout = true;    // the producer loads dO beside Q
  static constexpr bool kTma = false;         // the producer's cp.async loads
  static constexpr bool kBlockNotices = false;  // one block per CTA: no block notices
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kHeadDim == 256 ? 48 : 64;
  static constexpr int kStages = 2;
  static constexpr int kQStages = 1;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters =
      ptx::ConsumerRegisters(kThreads, kProducerThreads, kProducerRegisters);

  static constexpr int kSTiles = kBlockN / 8;     // 8-column tiles of S / dP per warp
  static constexpr int kDqTiles = kHeadDim / 8;   // 8-column tiles of dQ per warp
  static constexpr int kScoreSteps = kHeadDim / 16;  // k16 steps of S = Q K^T, dP = dO V^T
  static constexpr int kDqSteps = kBlockN / 16;      // k16 steps (keys) of dQ += dS K

  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kQTileBytes = kBlockM * kHeadDim * 2;  // Q or dO
  static constexpr int kQSmemBytes = 2 * kQTileBytes;         // the slot: Q, then dO
  static constexpr int kKvSmemBytes = kBlockN * kHeadDim * 2;  // one K or V tile
  static constexpr int kTileSmemBytes = kQStages * kQSmemBytes + 2 * kStages * kKvSmemBytes;
  // The tiles, 1 KB to align them, the K/V stages' mbarriers (4 per stage) and the slot's (2).
  static constexpr int kSmemBytes = kTileSmemBytes + 1024 + 4 * kStages * 8 + 2 * kQStages * 8;

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "the dQ kernel: head dim 64-256");
  static_assert(kQTileBytes % 1024 == 0 && kKvSmemBytes % 1024 == 0,
                "every tile starts 1024-byte aligned (swizzle atoms)");
  static_assert(kSmemBytes <= 232448, "fits an H100 block (227 KB)");
  static_assert(kSmemBytes <= Sm90BackwardMaxSmemBytes(kHeadDim),
                "the dispatcher checks the device against the dK/dV kernel's need, the larger");
  static_assert(ptx::RegisterSplitFits(kThreads, kProducerThreads, kProducerRegisters,
                                       kConsumerRegisters),
                "the register split fits the CTA's register pool (ptx::RegisterPool)");
};

}  // namespace attnserve::kernels::flash
