// Compile-time geometry of the Hopper (sm_90a) backward dK/dV kernel (element type x head dim):
// 128 keys per CTA in two 64-key consumer warpgroups beside a producer warpgroup, query tiles of
// kBlockM rows streamed through two stages, the registers each role keeps, and the shared-memory
// layout (every tile 128-byte swizzled for wgmma, 1 KB aligned):
//   K, V (kBlockN rows each; persistent: K, V, K, V) | stage 0, stage 1: Q, dO (kBlockM rows
//   each), lse, D |
//   dS^T x 2 | dQ staging (the stages' full / empty mbarriers in stage 0's padding).
#pragma once

#include "kernels/attention_params.h"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

// kFusedDq_: dQ summed here into the float32 workspace (the atomic-dQ mode); false: dK and dV
// only, the dQ kernel (bwd_sm90_dq_kernel.cuh) computes dQ (the deterministic mode).
// kPersistent_: persistent CTAs with two K/V buffers (head dim 64 only; Sm90BackwardRunsPersistent
// in tile_config.h says when they run).
template <DType kDType, int kHeadDim_, bool kFusedDq_, bool kPersistent_>
struct BwdSm90Traits {
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = Sm90BackwardBlockN(kHeadDim);  // keys per CTA
  static constexpr int kBlockM = Sm90BackwardBlockM(kHeadDim);  // queries per streamed tile
  static constexpr int kWarpgroups = kBlockN / 64;              // consumers, 64 keys each
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = kWarpgroups * 128;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  static constexpr int kLoaderThreads = kProducerThreads;  // who runs BwdSm90Block's loads
  static constexpr bool kPersistent = kPersistent_;
  static constexpr int kKvBuffers = Sm90BackwardKvBuffers(kPersistent);
  static constexpr bool kFusedDq = kFusedDq_;
  // setmaxnreg split of the CTA's register pool (ptx::RegisterPool): the producer only computes
  // addresses; the consumers get the rest.
  static constexpr int kProducerRegisters = kSm90BackwardProducerRegisters;
  static constexpr int kConsumerRegisters =
      ptx::ConsumerRegisters(kThreads, kProducerThreads, kProducerRegisters);

  static constexpr int kSTiles = kBlockM / 8;      // 8-query tiles of S^T / dP^T per warp
  static constexpr int kDTiles = kHeadDim / 8;     // 8-column tiles of dK / dV per warp
  static constexpr int kScoreSteps = kHeadDim / 16;  // k16 steps of S^T = K Q^T, dP^T = V dO^T
  static constexpr int kGradSteps = kBlockM / 16;    // k16 steps of dV += P^T dO, dK += dS^T Q
  // dQ = dS K (64 queries x head dim) split over the warpgroups by head-dim halves (N = 32 at
  // head dim 64, 64 at 128; one reduction per dQ element).
  static constexpr int kDqCols = kHeadDim / kWarpgroups;
  static constexpr int kDqSteps = kBlockN / 16;  // k16 steps (keys)
  static constexpr int kDqTiles = kDqCols / 8;
  // Each consumer warp's 16 dQ rows, staged for its bulk reduction (bwd_sm90_dq_tiles.h).
  static constexpr int kDqPieceBytes = 16 * kDqCols * 4;
  static constexpr int kDqStageBytes = Sm90BackwardDqStageBytes(kHeadDim);
  // Head dim 64: tile it's dQ = dS K is issued in tile it+1 behind its S^T / dP^T, so the
  // tensor cores run it under the P^T math and its reduction runs under dV / dK. At 128 its 32
  // floats per thread beside S^T, dP^T, dK and dV would not fit the consumers' 240 registers.
  static constexpr bool kDeferredDq = kFusedDq && kHeadDim == 64;
  // Head dim 64: a tile's lse and D are read into registers right after its S^T / dP^T are
  // issued, under the wgmma (32 floats; at 128 there is no room for them).
  static constexpr bool kEarlyVectors = kHeadDim == 64;
  // Head dim 64: S^T and dP^T as RS wgmma, K and V from registers (32 per thread, loaded by
  // ldmatrix before the tile loop), so that per tile they read only Q and dO from shared memory
  // (-32 KB of the ~210 KB a tile's wgmma and other traffic read there). Measured against SS
  // (H200, bench/RESULTS.md "Session 32"): in the atomic mode +1 to +5% on the rows of 2048
  // keys or more, 0% on 32x512; in the deterministic mode +1 to +2%, whose kernel needs its
  // first tile peeled off the loop for ptxas to keep the fragments (RunTiles).
  static constexpr bool kRsScores = kHeadDim == 64;

  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;    // K or V
  static constexpr int kTileBytes = kBlockM * kHeadDim * 2;  // Q or dO of a query tile
  static constexpr int kStageBytes = Sm90BackwardStageBytes(kHeadDim, kPersistent);
  static constexpr int kStages = 2;
  // Unmasked key blocks start one query tile apart (BwdSm90Block; 2 measured no better here).
  static constexpr int kStartTileStride = 1;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kDsBuffers = kSm90BackwardDsBuffers;
  static constexpr int kExchangeBytes = Sm90BackwardExchangeBytes(kHeadDim);  // none here
  static constexpr int kSmemBytes = Sm90BackwardSmemBytes(kHeadDim, kPersistent);

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 128, "head dim: 64 or 128 (whole swizzle rows)");
  static_assert(!kPersistent || Sm90BackwardHasPersistent(kHeadDim),
                "room for a second K/V pair (head dim 64)");
  static_assert(kBlockN == 128 && kWarpgroups == 2, "two 64-key warpgroups");
  static_assert(kBlockM == 64, "dQ: one 64-query product per warpgroup");
  static_assert(kDqCols == 32 || kDqCols == 64, "dQ: a wgmma N of 32 or 64");
  static_assert(2 * kBlockM <= kLoaderThreads, "lse and D of a tile: one float per thread");
  static_assert(kConsumerRegisters <= 256 && kDsBuffers == 2, "register split, dS^T buffers");
  static_assert(kKvBytes % 1024 == 0 && kTileBytes % 1024 == 0 && kStageBytes % 1024 == 0 &&
                    kDsBytes % 1024 == 0,
                "every tile starts 1024-byte aligned (swizzle atoms)");
  static_assert(kStageBytes >= 2 * kTileBytes + 2 * kBlockM * 4 + kSm90BackwardBarrierBytes +
                                   Sm90BackwardKvBarrierBytes(kPersistent),
                "stage layout (stage 0 keeps the mbarriers after its lse and D)");
  static_assert(kSmemBytes == 2 * kKvBuffers * kKvBytes + 2 * kStageBytes +
                                  kDsBuffers * kDsBytes + kDqStageBytes + 1024,
                "host and device agree");
  static_assert(kExchangeBytes == 0, "no exchange tile at 64 / 128");
  static_assert(kDqStageBytes == (kConsumerThreads / 32) * kDqPieceBytes,
                "dQ staging: one piece per consumer warp");
};

}  // namespace attnserve::kernels::flash
