// Tile sizes of the flash forward kernel per instantiated head dim: one constexpr heuristic, a
// comment per choice. Plain C++ so the host dispatcher and the kernels agree on every number.
#pragma once

#include <algorithm>

#include "kernels/flash/arch.h"
#include "kernels/flash/tuning.h"

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

// sm80/sm90 (A100, H100) with mma.sync: 228 KB shared memory and 64K registers per SM. Measured
// on the H100 (bench/RESULTS.md): larger key tiles win even where ptxas spills a few bytes
// (12-92 per thread, L1-resident), so hdim 64 and 128 take them; FlashAttention-2's own
// hdim-128 kernel spills more. More query rows per warp (32 rather than 16) halve the
// shared-memory traffic of K/V fragments per mma.
constexpr ForwardTiles Sm80ForwardTiles(int head_dim) {
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

// Hopper (sm_90a) forward (fwd_sm90_kernel.cuh): the head dims with an instantiation (multiples
// of 64: whole 128-byte swizzle rows), and its tiles: 64 query rows per warpgroup, each
// S = Q K^T one wgmma of N = block_n keys.
inline constexpr int kSm90ForwardHeadDims[] = {64, 128, 256};
// Query rows per CTA at head dim 64: 192 (three consumer warpgroups, FlashAttention-3's hdim-64
// tile). Measured against 128 with the warp-specialized kernel (H100, bf16, bench/RESULTS.md
// "Hopper forward, warp specialized"): +8 to +26% on every anchor row but 32x512 causal (-5%).
constexpr int Sm90ForwardBlockM(int head_dim) {
  // At 128 and 256 two consumer warpgroups of 64 rows: O (64/128 floats) plus S and P leave no
  // registers for a third (160 per consumer thread with four warpgroups; enough at 64).
  return head_dim <= 64 ? 192 : 128;
}
constexpr int Sm90ForwardBlockN(int head_dim, bool persistent) {
  // 64/128: 128-key tiles: S (64 floats) + O (32/64) + P (32 registers) stay under the cap,
  // and shared memory (Q + 2 / 3 stages of K and V) is 88/225 KB.
  // 256: O alone is 128 floats per thread and Q + 2 stages of 128-key K/V would be 320 KB.
  // 80-key tiles (FlashAttention-3's) with one CTA per block: shared memory 225 KB, S 40 floats;
  // measured against 64 (H100, bf16, bench/RESULTS.md "Hopper forward at 256: 80-key tiles with
  // one CTA per block"): +3 to +6% on every anchor row of 2048 keys or more, -3 to -10% on
  // 32x512, where 512 keys fill 6.4 tiles. So 64-key tiles (193 KB, S 32 floats) when
  // persistent (up to 1024 keys). At 128, 176- or 160-key tiles (FlashAttention-3's without a
  // causal mask) with two stages lost 3-6% on 8x2048 against three 128-key stages and moved the
  // longer rows by -1 to +1% ("Hopper forward at 128: 176- and 160-key tiles").
  if (head_dim <= 128) return 128;
  return persistent ? 64 : 80;
}
// Whether the Hopper forward runs persistent (at most one CTA per SM, each running query blocks
// one after another, the next block's first tiles loading under the current one's end) or one
// CTA per query block. Persistent pays where blocks are short and loses where they are long,
// measured against one CTA per block (H100, bf16, bench/RESULTS.md "Hopper forward, persistent
// on short keys"): +10 to +12% on 32x512 at head dims 64 and 128, +2 to +3% at 256; persistent
// at every length ran 3% (non-causal) to 15-40% (causal) below main's numbers on 2x8192 and
// 1x16384 and 27% on the hdim-64 mixed-length batch: the static round-robin leaves CTAs with
// unequal work where blocks carry many key tiles, which the hardware's scheduling of one CTA
// per block evens out.
// With the ping-pong turns running on from block to block (fwd_sm90_kernel.cuh), persistent up
// to 2048 keys beat one CTA per block on 8x2048 by 3 to 4% at head dim 64 and 2 to 3% at 128;
// at 128 it was within 1.5% once the one-CTA-per-block kernel ran the softmax under P V, which
// the persistent one does not there (Sm90ForwardSoftmaxUnderPv), and at 256 it lost 14% on
// 8x2048 causal (bench/RESULTS.md "Hopper forward: turns across blocks, the softmax under P V").
// A benchmark build may set one bound for every head dim (tuning.h).
constexpr int Sm90ForwardPersistentMaxKeys(int head_dim) {
  if (kSm90ForwardPersistentMaxKeysOverride > 0) return kSm90ForwardPersistentMaxKeysOverride;
  return head_dim <= 64 ? 2048 : 1024;
}
constexpr bool Sm90ForwardPersistent(int head_dim, int max_seqlen_k) {
  return max_seqlen_k <= Sm90ForwardPersistentMaxKeys(head_dim);
}
// Whether the Hopper forward lays each sequence's query blocks from its end (fwd_block.cuh's
// LocateBlock): the partial block, where the rows are no multiple of the block's, is then the
// sequence's first rather than its last. Under causal masking that leaves a partial block's idle
// consumer warpgroups in the block with the fewest key tiles instead of the most: at head dim 64
// (192 rows, 128-key tiles) 32x512 causal takes 8 rounds of key tiles per (head, sequence)
// instead of 9 (check_fwd_key_tiles.py). Only where the block's rows are no multiple of the key
// tile: where they are (128 rows on 128-key tiles), each causal block laid from the start crosses
// one key tile on its diagonal, laid from the end mostly two.
// Measured against the partial block last (H200, bf16, bench/RESULTS.md "Session 33", call 3,
// both column orders): at 64 +4% on 32x512 causal, +2% on 8x2048 causal, +0.4 to +0.7% on the
// longer causal rows, 0 without a mask; at 256 with one CTA per block (80-key tiles) +1.9% on the
// mixed-length causal row; at 128 (128 rows on 128-key tiles) -1.2% on that row.
constexpr bool Sm90ForwardBlocksFromEnd(int head_dim, bool persistent) {
  return Sm90ForwardBlockM(head_dim) % Sm90ForwardBlockN(head_dim, persistent) != 0;
}
// Stages of the K/V ring between the producer warpgroup and the consumers. One CTA per block,
// measured (H100, bf16, bench/RESULTS.md "Hopper forward, warp specialized"): a third stage is
// worth +2 to +7% at head dim 128 on every row with 2048 keys or more (-2 to -3% at 32x512;
// 225 KB of shared memory with Q) and 0 to -2% at 64 (-1 to -3% with today's 192-row blocks,
// 2026-11-28, "Host time in the timed interval", call G); at 256 only two fit; measured again on
// 2026-11-27, two stages ran at 0.97-0.99x three. Persistent, two stages and a second Q slot beat
// three stages and one slot at 128 by 7 to 8% on 32x512 ("Hopper forward, persistent on short
// keys", call 4, q2).
// A benchmark build may set the count at head dims up to 128 (tuning.h).
constexpr int Sm90ForwardStages(int head_dim, bool persistent) {
  if (kSm90ForwardStagesOverride != 0 && head_dim <= 128) return kSm90ForwardStagesOverride;
  return head_dim == 128 && !persistent ? 3 : 2;
}
// TMA loads in the producer (fwd_sm90_tma_producer.cuh) at head dim 256, else cp.async from its
// 128 threads; a benchmark build may move the bound (tuning.h's ATTN_FLASH_SM90_FWD_TMA).
constexpr bool Sm90ForwardTma(int head_dim) {
  return kSm90ForwardTmaFrom > 0 && head_dim >= kSm90ForwardTmaFrom;
}
// O stored by TMA (fwd_sm90_kernel.cuh's Epilogue) at 128 and 256: each consumer warp writes its
// 16 rows into the Q slot as before, and one lane stores them with a TMA box per 64 head-dim
// columns instead of the warp's 16-byte loads and stores; a warp whose rows cross the sequence's
// end stores them the old way (a box would write the next sequence's rows). Measured against
// the 16-byte stores (H100, bf16, bench/RESULTS.md "Hopper forward: O stored by TMA"): +1 to +2%
// on 8x2048 at 128 and 256 and on 32x512 non-causal at 256, -1% on 32x512 causal at 256, within
// 2% elsewhere; at 64 -8 to -13% on 8x2048 and up to -9% on 32x512 (persistent, three consumer
// warpgroups). tuning.h's ATTN_FLASH_SM90_FWD_TMA_STORE moves the bound.
constexpr bool Sm90ForwardTmaStore(int head_dim) {
  return kSm90ForwardTmaStoreFrom > 0 && head_dim >= kSm90ForwardTmaStoreFrom;
}
// Key tiles per consumer warpgroup (fwd_sm90_kernel.cuh's Run: a warpgroup passes over the block's
// key tiles that none of its 64 rows see) at head dim 64; every warpgroup computes every tile of
// its block above (tuning.h's ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS moves the bound).
constexpr bool Sm90ForwardWarpgroupKeys(int head_dim) {
  return head_dim <= kSm90ForwardWarpgroupKeysUpTo;
}
// Q slots: while the consumers finish one query block, a persistent CTA's producer loads the
// next block's Q into a free slot. Two up to head dim 128; at 256 the K/V ring takes the room,
// so the next Q waits for the block's epilogue (which writes O through its Q slot) while its
// first K tile loads. One CTA per block needs one.
constexpr int Sm90ForwardQStages(int head_dim, bool persistent) {
  return persistent && head_dim <= 128 ? 2 : 1;
}
// Whether the persistent Hopper forward's producer tells the consumers where each block lies
// (a notice per Q slot: FwdBlockNotice, kSm90ForwardBlockNoticeBytes) instead of each
// consumer warpgroup walking the blocks itself: with the cp.async producer (head dims 64 and
// 128). Measured against the walk (H200, bench/RESULTS.md "Session 32"): +0.7 to +3.6% on
// 32x512 at 64 and 128, 0 to +1.4% on 8x2048; with the TMA producer at 256, -0.7 to -2.5% on
// 32x512 (its 40 registers spilled 12 bytes with them).
constexpr bool Sm90ForwardBlockNotices(int head_dim, bool persistent) {
  return persistent && !Sm90ForwardTma(head_dim);
}
inline constexpr int kSm90ForwardBlockNoticeBytes = 48;
// The Q slots, the K and V stages, 1 KB to align the tiles to the swizzle atoms, the 8-byte
// mbarriers: four per stage (K full / V full / K empty / V empty) and two per Q slot, and the
// Q slots' block notices where there are any.
constexpr int Sm90ForwardSmemBytes(int head_dim, bool persistent) {
  return (Sm90ForwardQStages(head_dim, persistent) * Sm90ForwardBlockM(head_dim) +
          2 * Sm90ForwardStages(head_dim, persistent) * Sm90ForwardBlockN(head_dim, persistent)) *
             head_dim * 2 +
         1024 + 32 * Sm90ForwardStages(head_dim, persistent) +
         (16 + (Sm90ForwardBlockNotices(head_dim, persistent) ? kSm90ForwardBlockNoticeBytes : 0)) *
             Sm90ForwardQStages(head_dim, persistent);
}
// Whether a consumer warpgroup's softmax of one key tile runs while its P V of the tile before
// is on the tensor cores (FlashAttention-3's intra-warpgroup overlap; fwd_sm90_kernel.cuh's Step),
// or after it. Measured against after (H100, bf16, bench/RESULTS.md "Hopper forward: turns across
// blocks, the softmax under P V"): +4 to +6% at 256 (0% on 32x512 causal); at 128 +1 to +5% on
// rows of 2048 keys or more but -3 to -5% on 32x512 (the persistent kernel); at 64 (three
// consumer warpgroups of 160 registers) -3 to -19%.
constexpr bool Sm90ForwardSoftmaxUnderPv(int head_dim, bool persistent) {
  return head_dim == 256 || (head_dim == 128 && !persistent);
}
// What the Hopper forward may need at head_dim, whichever schedule the lengths choose.
constexpr int Sm90ForwardSmemBytes(int head_dim) {
  return std::max(Sm90ForwardSmemBytes(head_dim, true), Sm90ForwardSmemBytes(head_dim, false));
}

// Hopper (sm_90a) backward dK/dV kernels (NOTES.md "Hopper backward"), query tiles of 64 rows
// streamed in two stages by a producer warpgroup to two consumer warpgroups:
// - head dims 64 and 128 (bwd_sm90_kernel.cuh): 128 keys per CTA, consumer warpgroups of 64 keys
//   (FlashAttention-3's hdim-64/128 block);
// - head dims 192 and 256 (bwd_sm90_wide_kernel.cuh): 64 keys per CTA, the consumers split by
//   role (S^T/P^T/dV and dP^T/dS^T/dK), since 128 keys would need 192-256 dK + dV floats per
//   thread.
inline constexpr int kSm90BackwardHeadDims[] = {64, 128, 192, 256};
// Head dim 256: dQ in a kernel of its own (bwd_sm90_dq_kernel.cuh: S and dP recomputed per
// 128-row query block, dQ written once), and a dK/dV kernel without dQ. Measured +23 to +40% over
// the wide kernel's float32 dQ atomics on every anchor row (bench/RESULTS.md "Hopper at 256: TMA
// forward and the dQ kernel"), where the reductions took most of the time ("Why two tiles apart,
// and where the time goes"). No atomics: the backward at 256 is deterministic in both modes. At
// 64-192 the atomic mode keeps dQ fused (dQ by tile): 7 products per tile pair instead of 5 would
// cost more than the reductions do there; the deterministic mode there runs the dK/dV kernel
// without dQ and then the dQ kernel (bwd_sm90_launch.cuh).
constexpr bool Sm90BackwardSeparateDq(int head_dim) { return head_dim == 256; }
// Registers of the producer warpgroup (setmaxnreg; a multiple of 8); the consumers get the rest
// of the CTA's pool: 240 at 24. At 32 the consumers would get 232, and at head dim 128 ptxas then
// spills 56 bytes and serializes the wgmma (C7512); at 24 the producer spills a few bytes instead
// (a few local loads per tile, off the consumers' path).
inline constexpr int kSm90BackwardProducerRegisters = 24;
constexpr int Sm90BackwardBlockN(int head_dim) { return head_dim <= 128 ? 128 : 64; }
constexpr int Sm90BackwardBlockM(int head_dim) {
  // 64-query tiles: S^T and dP^T 32 floats each per thread beside dK + dV (64 / 128 floats at
  // head dim 64 / 128; at 192 / 256 one of dK, dV per warpgroup: 96 / 128 floats); each
  // warpgroup's dQ = dS K is the 64 rows x half the head dim. 128-query tiles at head dim 64
  // (FlashAttention-3's) spilled 8-132 bytes at 255 registers (S^T and dP^T 64 floats each in
  // flight beside P^T, G, dK and dV), with every arrangement tried.
  return head_dim <= 256 ? 64 : 0;  // (no instantiation above 256)
}
// The stage ring's full / empty mbarriers (Sm90StageBarriers<2, 1>): they live in stage 0's
// padding after its lse and D, which every stage has room for (at head dim 256 the tiles take
// all 227 KB of a block, with no 32 bytes to spare elsewhere).
inline constexpr int kSm90BackwardBarrierBytes = 2 * 2 * 8;
// A persistent dK/dV kernel: min(key blocks, SMs) CTAs each running every gridDim.x-th key block,
// K and V in two buffers used by turns, so that the next block's K, V and first query tiles load
// while the current one finishes. Only head dim 64 has room for the second K/V pair.
constexpr bool Sm90BackwardHasPersistent(int head_dim) { return head_dim == 64; }
// Which dK/dV kernel runs (bench/RESULTS.md "Hopper backward at 64: persistent dK/dV CTAs",
// H200, against one CTA per key block): persistent measured +2 to +6% without a mask, +2 to +5%
// in the deterministic mode (no dQ) on every row, and +2% on causal rows of up to 2048 keys with
// dQ fused; causal with dQ fused at 8192 / 16384 keys and the varlen mix it lost 3 to 5%. There
// the early key blocks are the heavy ones, which the GPU hands to SMs as they free up, while a
// fixed share per CTA leaves the busiest CTA ~3% over the mean by the tile counts (dealt back and
// forth instead: 22% over on 8x2048, where it lost 14%).
// uneven_blocks: a mask that gives key blocks unequal work along the sequence (one of the
// window's bounds set, e.g. causal).
constexpr bool Sm90BackwardRunsPersistent(int head_dim, bool fused_dq, bool uneven_blocks,
                                          int max_seqlen_k) {
  return Sm90BackwardHasPersistent(head_dim) &&
         !(fused_dq && uneven_blocks && max_seqlen_k > 2048);
}
constexpr int Sm90BackwardKvBuffers(bool persistent) { return persistent ? 2 : 1; }
// The persistent kernel's K/V buffers' mbarriers (a ring of two, Sm90StageBarriers<2, 1>),
// after the stage ring's.
constexpr int Sm90BackwardKvBarrierBytes(bool persistent) { return persistent ? 2 * 2 * 8 : 0; }
// Q and dO of a query tile plus its lse and D (and room for the mbarriers), rounded up to whole
// 1 KB swizzle atoms.
constexpr int Sm90BackwardStageBytes(int head_dim, bool persistent) {
  return (2 * Sm90BackwardBlockM(head_dim) * head_dim * 2 + 2 * Sm90BackwardBlockM(head_dim) * 4 +
          kSm90BackwardBarrierBytes + Sm90BackwardKvBarrierBytes(persistent) + 1023) /
         1024 * 1024;
}
// Head dims 192 / 256 only: the float32 exchange tile (G = dS^T / (dP^T - D), keys x queries)
// that the S^T warpgroup hands to the dP^T warpgroup.
constexpr int Sm90BackwardExchangeBytes(int head_dim) {
  return head_dim <= 128 ? 0 : Sm90BackwardBlockN(head_dim) * Sm90BackwardBlockM(head_dim) * 4;
}
// dS^T tiles (keys x queries, 16 bits), two: at head dims 64 / 128 the warp-specialized kernel's
// consumer warpgroups drift up to one tile apart, so one may write tile it+1's dS^T while the
// other's dQ still reads tile it's; at 192 / 256 the kernel issues each tile's dQ = dS K in the
// next tile under its S^T / dP^T and element-wise phase (measured faster, NOTES.md "Hopper
// backward at head dims 192 and 256", "Deferred dQ").
inline constexpr int kSm90BackwardDsBuffers = 2;
// Head dims 64 / 128 / 192 (dQ by tile): each consumer warp's staging of its 16 dQ rows of half
// the head dim, float32, for its bulk reduction (bwd_sm90_dq_tiles.h); 16 / 32 / 48 KB. At 256
// dQ is a kernel of its own (Sm90BackwardSeparateDq).
constexpr int Sm90BackwardDqStageBytes(int head_dim) {
  return head_dim <= 192 ? Sm90BackwardBlockM(head_dim) * head_dim * 4 : 0;
}
// K and V (resident; two pairs when persistent), two stages, the dS^T tiles, the exchange tile
// (192 / 256), the dQ staging (64 / 128 / 192), 1 KB for alignment: 115 / 195 / 227 / 227 KB at
// head dim 64 / 128 / 192 / 256 (147 KB persistent at 64; a third stage would fit neither at 192
// nor at 256).
constexpr int Sm90BackwardSmemBytes(int head_dim, bool persistent) {
  return 2 * Sm90BackwardKvBuffers(persistent) * Sm90BackwardBlockN(head_dim) * head_dim * 2 +
         2 * Sm90BackwardStageBytes(head_dim, persistent) +
         kSm90BackwardDsBuffers * Sm90BackwardBlockN(head_dim) *
             Sm90BackwardBlockM(head_dim) * 2 +
         Sm90BackwardExchangeBytes(head_dim) + Sm90BackwardDqStageBytes(head_dim) + 1024;
}
// The most shared memory any dK/dV kernel at this head dim takes (what the host checks a device
// for before routing the backward to the Hopper path).
constexpr int Sm90BackwardMaxSmemBytes(int head_dim) {
  return Sm90BackwardSmemBytes(head_dim, Sm90BackwardHasPersistent(head_dim));
}

// Dynamic shared memory of one forward CTA: Q (block_m rows), one K and one V tile (block_n rows
// each), every row padded by one 16-byte vector so ldmatrix reads are bank-conflict free.
constexpr int ForwardSmemRowBytes(int head_dim) { return (head_dim + kHeadDimGranule) * 2; }
template <class Arch>
constexpr int ForwardSmemBytes(int head_dim) {
  return (ForwardTilesFor<Arch>(head_dim).block_m + 2 * ForwardTilesFor<Arch>(head_dim).block_n) *
         ForwardSmemRowBytes(head_dim);
}

// Backward (bwd_*.cuh). Every warp of the dQ pass and of the 16-keys-per-warp dK/dV kernel owns
// 16 resident rows (keys for dK/dV, queries for dQ) and multiplies them with 64-row tiles of the
// other side that stream through shared memory. Per thread the dK/dV kernel holds dK and dV plus
// two score tiles (S^T and dP^T): at head dim 128 (128 dK/dV floats with 8 warps x 16 keys or the
// pair layout's 32 keys x half the head dim) that is ~250 registers. Head dims 192 and 256 keep
// dK/dV at 96-128 floats per thread by halving the key block (64 keys, 8 warps: 32 keys x a
// quarter of the head dim per warp, FlashAttention-2's hdim-256 tiles).
inline constexpr int kMaxBackwardHeadDim = 256;
inline constexpr int kBackwardStreamRows = 64;  // streamed rows per stage (dQ pass; dK/dV below)
inline constexpr int kBackwardDqWarps = 4;      // dQ pass: 64 resident query rows

// dK/dV kernel: 8 warps (128 keys per CTA, FlashAttention-2's key block) on Sm80: every streamed
// Q/dO tile feeds twice the keys, so per flop the Q/dO reloads and the float32 dQ atomics (one
// tile-rows x d add per streamed tile and CTA) are halved against 64-key blocks. 4 warps (64
// keys) on Sm75, whose 64 KB of shared memory hold no 128-row K and V. (4 warps on Sm80 measured
// 23-29% slower at head dim 128: NOTES.md "Tuning knobs".)
inline constexpr int kBackwardWideWarps = 8;
// The variant for devices whose blocks cannot hold the wide one (an A100 gives 163 KB, the wide
// kernel needs 173-178 KB at head dims 64 and 128; sm86/89 give 99 KB): 4 warps, 64 keys, 16
// keys per warp. The dispatcher picks it at run time (bwd_launch.cuh).
inline constexpr int kBackwardNarrowWarps = 4;
// Head dims above this one take the 64-key pair layout (wide: two stages; narrow: one).
inline constexpr int kBackwardLargeHeadDim = 128;

// FlashAttention-2's warp layout for the dK/dV kernel (bwd_dkdv_pair_kernel.cuh) at head dims
// 64 and 128 on Sm80: 32 keys per warp pair, P^T and dS^T through shared memory; at 192 and 256
// with 64-key blocks (always). (It measured +13 to +27% over 16 keys per warp at 64 and 128:
// NOTES.md "Tuning knobs".)
// Streamed query rows per stage of the pair layout at head dim 64 (FlashAttention-2's 128 x 128
// tile there: each warp's score tiles are 32 keys x 64 queries, so every K/V fragment feeds twice
// the products; measured +6-10% over 64 rows, bench/RESULTS.md; 252 registers, no spills).
inline constexpr int kBackwardPair64StreamRows = 128;

// Geometry of one dK/dV kernel variant: the wide one (where the block's shared memory holds it)
// or the narrow one (A100, sm86/89).
struct BackwardDkDvShape {
  int warps;
  int key_rows;     // resident keys per CTA
  int stream_rows;  // streamed query rows per stage
  int stages;       // stages of the streamed tiles
  bool pair;        // bwd_dkdv_pair_kernel.cuh (else bwd_dkdv_kernel.cuh, 16 keys per warp)
  int dq_stages;    // stages of the deterministic dQ pass's K/V tiles
};

// Stages of the streamed tiles: two with cp.async (the next tile lands under this one's math);
// one on Sm75, whose register-staged copies are complete when issued, so a second stage would
// only cost shared memory (46 KB instead of 64 KB at head dim 64).
template <class Arch>
constexpr int BackwardStages() {
  return Arch::kAsyncCopy ? 2 : 1;
}

template <class Arch>
constexpr BackwardDkDvShape BackwardDkDvShapeFor(int head_dim, bool wide) {
  constexpr int kStages = BackwardStages<Arch>();
  if (Arch::kAsyncCopy && head_dim > kBackwardLargeHeadDim) {
    // 192/256: 64 keys x 64 queries, 8 warps (FlashAttention-2's tiles); dK + dV are 96-128
    // floats per thread. Wide: two stages (169 / 217 KB); narrow: one stage of the dK/dV
    // kernel and of the dQ pass (119 / 150 KB, within an A100's 163 KB; the loads of a tile
    // no longer overlap the previous tile's math there).
    return {8, 64, kBackwardStreamRows, wide ? 2 : 1, true, wide ? 2 : 1};
  }
  const int warps = wide ? (Arch::kAsyncCopy ? kBackwardWideWarps : 4) : kBackwardNarrowWarps;
  const bool pair = Arch::kAsyncCopy && warps == 8 && (head_dim == 128 || head_dim == 64);
  const int stream_rows = pair && head_dim == 64 ? kBackwardPair64StreamRows : kBackwardStreamRows;
  return {warps, warps * 16, stream_rows, kStages, pair, kStages};
}

// Whether the wide and narrow variants differ (not on Sm75).
template <class Arch>
constexpr bool BackwardHasNarrow(int head_dim) {
  const BackwardDkDvShape w = BackwardDkDvShapeFor<Arch>(head_dim, true);
  const BackwardDkDvShape n = BackwardDkDvShapeFor<Arch>(head_dim, false);
  return w.warps != n.warps || w.key_rows != n.key_rows || w.stages != n.stages ||
         w.dq_stages != n.dq_stages;
}

// Bytes of one stage: two streamed tiles of `rows` rows (Q, dO or K, V) with padded rows as in
// the forward, and `rows` lse and D floats (the dK/dV kernel's per-query scalars).
constexpr int BackwardStageBytes(int head_dim, int rows) {
  return 2 * rows * ForwardSmemRowBytes(head_dim) + 2 * rows * 4;
}

// 16-bit (keys x streamed rows) tiles of the dK/dV kernel: 16 keys per warp
// (bwd_dkdv_kernel.cuh): one dS^T tile per stage for the atomic dQ product (with two, dS of tile
// i+1 is written while other warps still read dS of tile i, and one barrier per tile suffices);
// pair layout (bwd_dkdv_pair_kernel.cuh): the P^T and dS^T tiles.
constexpr int BackwardDsBuffers(const BackwardDkDvShape& shape) {
  return shape.pair ? 2 : shape.stages;
}

// dK/dV kernel: resident K and V, the stages, the P^T / dS^T tiles.
// Sm80 wide: 173 KB at head dim 128, 178 KB at 64 (128-row stages), 77 and 141 KB at 32 and 96,
// 169 and 217 KB at 192 and 256 (one 8-warp CTA per H100 SM everywhere: registers allow no
// second); narrow 192/256: 119 / 150 KB. Sm75: 46 KB at 64.
template <class Arch>
constexpr int BackwardDkDvSmemBytes(int head_dim, bool wide) {
  const BackwardDkDvShape shape = BackwardDkDvShapeFor<Arch>(head_dim, wide);
  return 2 * shape.key_rows * ForwardSmemRowBytes(head_dim) +
         shape.stages * BackwardStageBytes(head_dim, shape.stream_rows) +
         BackwardDsBuffers(shape) * shape.key_rows * ForwardSmemRowBytes(shape.stream_rows);
}

// dQ pass (deterministic mode): resident Q and dO (64 rows), the stages (K and V tiles).
constexpr int BackwardDqSmemBytesFor(int head_dim, int stages) {
  return 2 * kBackwardDqWarps * 16 * ForwardSmemRowBytes(head_dim) +
         stages * BackwardStageBytes(head_dim, kBackwardStreamRows);
}
template <class Arch>
constexpr int BackwardDqSmemBytes(int head_dim, bool wide) {
  return BackwardDqSmemBytesFor(head_dim, BackwardDkDvShapeFor<Arch>(head_dim, wide).dq_stages);
}

// The larger of the dK/dV kernel and the dQ pass of one variant: what a device must give a
// block to run the backward that way.
template <class Arch>
constexpr int BackwardSmemBytes(int head_dim, bool wide) {
  return BackwardDkDvSmemBytes<Arch>(head_dim, wide) > BackwardDqSmemBytes<Arch>(head_dim, wide)
             ? BackwardDkDvSmemBytes<Arch>(head_dim, wide)
             : BackwardDqSmemBytes<Arch>(head_dim, wide);
}

// The least a device must give a block to run the backward at all (the narrow variant): what
// the dispatcher checks and the router compares with the device.
template <class Arch>
constexpr int BackwardSmemBytes(int head_dim) {
  return BackwardSmemBytes<Arch>(head_dim, false);
}

}  // namespace attnserve::kernels::flash
