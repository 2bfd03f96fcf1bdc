// Compile-time geometry of the Hopper (sm_90a) backward dK/dV kernel at head dims 192 and 256
// (bwd_sm90_wide_kernel.cuh): 64 keys per CTA, a producer warpgroup streaming query tiles of 64
// rows through two stages to two consumer warpgroups split by role, the registers each role
// keeps, and the shared-memory layout (every bf16/fp16 tile 128-byte swizzled for wgmma, 1 KB
// aligned):
//   K, V (64 rows each) | stage 0, stage 1: Q, dO (64 rows each), lse, D (stage 0 then the
//   mbarriers) | dS^T of the even tiles, of the odd tiles | exchange (G) | dQ staging (192).
#pragma once

#include "kernels/attention_params.h"
#include "kernels/flash/bwd_sm90_dq_tiles.h"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

// kFusedDq_: dQ summed here into the float32 workspace by tile (the atomic-dQ mode at 192); false:
// dK and dV only, and the dQ kernel (bwd_sm90_dq_kernel.cuh) computes dQ (both modes at 256,
// where dQ by tile has no room; the deterministic mode at 192).
template <DType kDType, int kHeadDim_, bool kFusedDq_>
struct BwdSm90WideTraits {
  using Element = typename ElementOf<kDType>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = Sm90BackwardBlockN(kHeadDim);  // keys per CTA
  static constexpr int kBlockM = Sm90BackwardBlockM(kHeadDim);  // queries per streamed tile
  // The producer warpgroup, then the consumers: 0 S^T, P^T, dV; 1 dP^T, dS^T, dK.
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  static constexpr int kLoaderThreads = kProducerThreads;  // who runs BwdSm90Block's loads
  static constexpr bool kPersistent = false;  // one CTA per key block (BwdSm90Block)
  static constexpr int kKvBuffers = 1;
  // setmaxnreg split of the CTA's register pool (ptx::RegisterPool), as at head dims 64/128.
  static constexpr int kProducerRegisters = kSm90BackwardProducerRegisters;
  static constexpr int kConsumerRegisters =
      ptx::ConsumerRegisters(kThreads, kProducerThreads, kProducerRegisters);

  static constexpr int kSTiles = kBlockM / 8;        // 8-query tiles of S^T / dP^T per warp
  static constexpr int kDTiles = kHeadDim / 8;       // 8-column tiles of dK or dV per warp
  static constexpr int kScoreSteps = kHeadDim / 16;  // k16 steps of S^T = K Q^T, dP^T = V dO^T
  static constexpr int kGradSteps = kBlockM / 16;    // k16 steps of dV += P^T dO, dK += dS^T Q
  static constexpr int kDqSteps = kBlockN / 16;      // k16 steps (keys) of dQ = dS K
  // Without dQ the dS^T tiles (and at 192 the dQ staging) go unused: the shared-memory layout
  // is still the fused kernel's (NOTES.md "What is next").
  static constexpr bool kFusedDq = kFusedDq_;
  // dQ = dS K at 192 (64 queries x head dim): each warpgroup half the head dim, as two products
  // whose B operand (K, MN-major) starts at a 64-column block or 32 columns into one (the only
  // mid-row start wgmma's swizzled descriptors allow: the product must end inside the block):
  // warpgroup 0 columns [0, 64) and [64, 96); warpgroup 1 [128, 192) and [96, 128). Each tile's
  // dQ products are issued behind the next tile's S^T / dP^T (the kernel's Step).
  static constexpr int kDqColsA = 64;
  static constexpr int kDqColsB = kHeadDim / 2 - 64;  // 32 at 192
  __host__ __device__ static constexpr int DqColA(int warpgroup) {
    return warpgroup * 128;
  }
  __host__ __device__ static constexpr int DqColB(int warpgroup) {
    return 64 + warpgroup * 32;
  }

  // Tile it's dQ products are issued in tile it+1 behind its S^T / dP^T (the kernel's Step),
  // so tile it's dS^T tile must outlive tile it+1's: dS^T of tile it in buffer it % 2.
  static constexpr int kDsBuffers = kSm90BackwardDsBuffers;

  static constexpr int kVecElems = 16 / sizeof(Element);
  static constexpr int kRowVecs = kHeadDim / kVecElems;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;    // K or V
  static constexpr int kTileBytes = kBlockM * kHeadDim * 2;  // Q or dO of a query tile
  static constexpr int kStageBytes = Sm90BackwardStageBytes(kHeadDim, false);
  static constexpr int kStages = 2;
  // Unmasked key blocks start two query tiles apart (BwdSm90Block). One apart, a CTA that ran a
  // little faster than its neighbour caught up with it and both then added into the same dQ
  // rows: 1x16384 non-causal lost 5% on average, up to 10% (bench/RESULTS.md "Hopper backward,
  // warp specialized at head dims 192/256").
  static constexpr int kStartTileStride = 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kExchangeBytes = Sm90BackwardExchangeBytes(kHeadDim);
  // dQ by tile at 192 (bwd_sm90_dq_tiles.h): each consumer warp stages its 16 rows of both dQ
  // products (64 + 32 columns) for one bulk reduction.
  static constexpr int kDqPieceBytes = 16 * (kHeadDim / 2) * 4;
  static constexpr int kDqStageBytes = Sm90BackwardDqStageBytes(kHeadDim);
  static constexpr int kSmemBytes = Sm90BackwardSmemBytes(kHeadDim, false);

  static_assert(sizeof(Element) == 2, "flash kernels take 16-bit elements");
  static_assert(kHeadDim == 192 || kHeadDim == 256, "the wide kernel: head dim 192 or 256");
  static_assert(kBlockN == 64 && kBlockM == 64, "one 64 x 64 score tile per warpgroup");
  static_assert(2 * kBlockM <= kLoaderThreads, "lse and D of a tile: one float per thread");
  static_assert(kExchangeBytes == 128 * kSTiles * 16, "exchange: 32 floats per thread");
  static_assert(kKvBytes % 1024 == 0 && kTileBytes % 1024 == 0 && kStageBytes % 1024 == 0 &&
                    kDsBytes % 1024 == 0,
                "every tile starts 1024-byte aligned (swizzle atoms)");
  static_assert(kStageBytes >= 2 * kTileBytes + 2 * kBlockM * 4 + kSm90BackwardBarrierBytes,
                "stage layout (stage 0 keeps the mbarriers after its lse and D)");
  static_assert(kConsumerRegisters <= 256, "register split");
  static_assert(kDsBuffers == 2, "one dS^T tile per tile parity");
  static_assert(kSmemBytes == 2 * kKvBytes + kStages * kStageBytes + kDsBuffers * kDsBytes +
                                   kExchangeBytes + kDqStageBytes + 1024,
                "host and device agree");
  static_assert(kDqStageBytes == (kHeadDim == 192 ? (kConsumerThreads / 32) * kDqPieceBytes : 0),
                "dQ staging: one piece per consumer warp, at 192 only");
  static_assert(!kFusedDq || kDqStageBytes > 0, "dQ by tile: at 192 only");
  static_assert(!kFusedDq || (TileDqColumn(kHeadDim, 1, 0) == DqColA(1) &&
                             TileDqColumn(kHeadDim, 1, kDqColsA / 8) == DqColB(1) &&
                             TileDqColumn(kHeadDim, 0, kDqColsA / 8) == DqColB(0)),
                "the conversion kernel reads the pieces as the products stage them");
  static_assert(kSmemBytes <= 232448, "fits an H100 block (227 KB, all of it at 192 and 256)");
};

}  // namespace attnserve::kernels::flash
