// Tile sizes of the flash forward kernel per instantiated head dim: one constexpr heuristic, a
// comment per choice. Plain C++ so the host dispatcher and the kernels agree on every number.
#pragma once

#include "kernels/flash/arch.h"

namespace attnserve::kernels::flash {

// Head dims with a kernel of their own; every multiple of 8 up to 256 runs on the next one up,
// the padding zero-filled in shared memory and never stored.
inline constexpr int kInstantiatedHeadDims[] = {32, 64, 96, 128, 192, 256};
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kHeadDimGranule = 8;  // one 16-byte vector of 16-bit elements

struct ForwardTiles {
  int block_m;  // query rows per CTA
  int block_n;  // keys per K/V tile
  int warps;    // each warp owns block_m / warps query rows (16 or 32)
};

// Tuning hook for benchmark builds only: with ATTN_FLASH_TILE_OVERRIDES defined (for C++ and
// CUDA alike), rows such as `{128, {128, 64, 4}},` from attn_flash_tile_overrides.inc on the
// include path replace the heuristic for their head dims. Normal builds define neither.
struct TileOverride {
  int head_dim;
  ForwardTiles tiles;
};
inline constexpr TileOverride kTileOverrides[] = {
#ifdef ATTN_FLASH_TILE_OVERRIDES
#include "attn_flash_tile_overrides.inc"
#endif
    {0, {0, 0, 0}}};

// sm80/sm90 (A100, H100) with mma.sync: 228 KB shared memory and 64K registers per SM. Measured
// on the H100 (bench/RESULTS.md): larger key tiles win even where ptxas spills a few bytes
// (12-92 per thread, L1-resident), so hdim 64 and 128 take them; FlashAttention-2's own
// hdim-128 kernel spills more. More query rows per warp (32 rather than 16) halve the
// shared-memory traffic of K/V fragments per mma.
constexpr ForwardTiles Sm80ForwardTiles(int head_dim) {
  for (const TileOverride& o : kTileOverrides) {
    if (o.head_dim == head_dim) return o.tiles;
  }
  // 32: 32 rows per warp, 64-key tiles; S (64 floats) plus O (32) leave room for prefetch.
  if (head_dim <= 32) return {128, 64, 4};
  // 64: 128-key tiles halve the online-softmax rescales per key; 1.03-1.13x the 64-key
  // version on the anchor rows.
  if (head_dim <= 64) return {128, 128, 4};
  // 96: O is 96 floats; 64-key tiles spill heavily on sm80, so 32-key tiles.
  if (head_dim <= 96) return {128, 32, 4};
  // 128: FlashAttention-2's 128x64 tiles; 1.02-1.13x the spill-free 32-key tiles.
  if (head_dim <= 128) return {128, 64, 4};
  // 192/256: a 32-row warp would need 192-256 O registers; 8 warps of 16 rows keep O at
  // 96-128. Shared memory at hdim 256: 136 KB (Q 128 rows, K and V 64 rows each), which still
  // fits the A100's 164 KB per block (128-key tiles would not).
  return {128, 64, 8};
}

// Turing (sm75, T4 / RTX 20xx): 64 KB of shared memory per SM (and per block), 64K registers,
// 1024 threads per SM; head dims up to 64 (FlashAttention 1's limit there), fp16 only. Tiles are
// sized so two CTAs share an SM (<= 32 KB each): with no cp.async a CTA stalls on its own
// loads and the other CTA's math has to cover them. Not measured on a Turing GPU (none here).
constexpr ForwardTiles Sm75ForwardTiles(int head_dim) {
  // 32: 32 rows per warp and 64-key tiles; 20 KB (three CTAs fit).
  if (head_dim <= 32) return {128, 64, 4};
  // 64: 32-key tiles keep Q + K + V at 27 KB (two CTAs) and S at 32 floats per thread.
  return {128, 32, 4};
}

template <class Arch>
constexpr ForwardTiles ForwardTilesFor(int head_dim) {
  if constexpr (Arch::kMmaK16) {
    return Sm80ForwardTiles(head_dim);
  } else {
    return Sm75ForwardTiles(head_dim);
  }
}

// Dynamic shared memory of one forward CTA: Q (block_m rows), one K and one V tile (block_n rows
// each), every row padded by one 16-byte vector so ldmatrix reads are bank-conflict free.
constexpr int ForwardSmemRowBytes(int head_dim) { return (head_dim + kHeadDimGranule) * 2; }
template <class Arch>
constexpr int ForwardSmemBytes(int head_dim) {
  return (ForwardTilesFor<Arch>(head_dim).block_m + 2 * ForwardTilesFor<Arch>(head_dim).block_n) *
         ForwardSmemRowBytes(head_dim);
}

// Backward (bwd_*.cuh). Both main kernels give each of their 4 warps 16 rows of a 64-row
// resident tile (keys for dK/dV, queries for dQ) and stream 64-row tiles of the other side
// through two shared-memory stages. Per thread the dK/dV kernel holds dK and dV (2 x head_dim/2
// floats at 16 rows per warp) plus two 16 x 64 score tiles (S^T and dP^T, 32 floats each): at
// head dim 128 that is ~200 registers, so 16-row warps and 64-wide streamed tiles are the limit;
// head dims above 128 (dK + dV alone would be 192-256 registers) are refused for now.
inline constexpr int kMaxBackwardHeadDim = 128;
inline constexpr int kBackwardWarps = 4;
inline constexpr int kBackwardBlock = 64;  // resident rows per CTA and streamed rows per stage

// Stages of the streamed tiles: two with cp.async (the next tile lands under this one's math);
// one on Sm75, whose register-staged copies are complete when issued, so a second stage would
// only cost shared memory (46 KB instead of 64 KB at head dim 64).
template <class Arch>
constexpr int BackwardStages() {
  return Arch::kAsyncCopy ? 2 : 1;
}

// Dynamic shared memory of either backward main kernel: two resident 64-row tiles (K, V or Q,
// dO), per stage two streamed 64-row tiles, padded rows as in the forward, and 64 lse and 64 D
// floats (the dK/dV kernel's per-query scalars), and one padded 64 x 64 16-bit dS tile (the
// dK/dV kernel's atomic dQ product). 112 KB at head dim 128 on Sm80: two CTAs per H100 SM.
template <class Arch>
constexpr int BackwardSmemBytes(int head_dim) {
  return (2 + 2 * BackwardStages<Arch>()) * kBackwardBlock * ForwardSmemRowBytes(head_dim) +
         BackwardStages<Arch>() * 2 * kBackwardBlock * 4 +
         kBackwardBlock * ForwardSmemRowBytes(kBackwardBlock);
}

}  // namespace attnserve::kernels::flash
