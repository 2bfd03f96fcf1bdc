// The flash kernels' benchmark-only tuning knobs: every one the records (bench/RESULTS.md,
// NOTES.md "Tuning knobs") show close enough to the shipped choice to be worth measuring again.
// Normal builds define none of these macros and get the shipped defaults; a benchmark build
// defines one for C++ and CUDA alike (`bench/run_gpu.sh --fwd-variant` or `--bwd-variant
// NAME=-DMACRO=VALUE`: the build's columns in the forward or the backward benchmark), and
// CI compiles each kept non-default value once (kernels/flash/CMakeLists.txt,
// the attn_kernels_flash_tuning_* object libraries). Knobs whose alternative lost are deleted,
// not kept here; a knob not measured yet says so.
#pragma once

namespace attnserve::kernels::flash {

// Stages of the Hopper forward's K/V ring at head dims up to 128 (Sm90ForwardStages in
// tile_config.h), both schedules; 0 keeps the shipped counts (3 at head dim 128 with one CTA per
// block, 2 otherwise). A third stage at 64 measured 0 to -2% with the 128-row blocks of then
// (bench/RESULTS.md "Hopper forward, warp specialized", st3) and -1 to -3% with the 192 rows
// that ship ("Host time in the timed interval", call G).
#ifndef ATTN_FLASH_SM90_FWD_STAGES
#define ATTN_FLASH_SM90_FWD_STAGES 0
#endif
inline constexpr int kSm90ForwardStagesOverride = ATTN_FLASH_SM90_FWD_STAGES;

// N > 0: at head dims up to N each consumer warpgroup of the Hopper forward computes only the
// key tiles its own 64 rows see (BlockRowsKeyTiles in fwd_block.cuh) and passes over the block's
// others, taking its ping-pong turn and releasing their stages (Sm90ForwardWarpgroupKeys in
// tile_config.h); 64 (shipped): at head dim 64 only; 0: every warpgroup computes every key tile
// of its block, masking what its rows do not see. Measured at 64 in two rounds (bench/RESULTS.md
// "Hopper forward: session 19's knobs", and "Hopper at 256: TMA forward and the dQ kernel", call
// D): +6 to +11% on 32x512 and 8x2048 causal, +4% on the varlen causal row, within -1 to +3% on
// the others; at 128 and 256 -1 to -5% (one round). What it saves: at head dim 64 (192-row
// blocks, 128-key tiles) 32x512 causal computes 20 warpgroup tiles per (head, sequence) instead
// of 27; on longer rows the diagonal tiles of causal blocks.
#ifndef ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS
#define ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS 64
#endif
inline constexpr int kSm90ForwardWarpgroupKeysUpTo = ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS;

// N > 0: the Hopper forward's producer loads by TMA at head dims N and above (Sm90ForwardTma in
// tile_config.h); 256 (shipped): TMA at 256, cp.async from the producer's 128 threads below; 0:
// cp.async everywhere. TMA: Q, K and V tiles by one thread, tensor maps made on the host per
// launch (sm90_tensor_maps.h), each tile's bytes counted on its full barrier, and cp.async only
// for the tile that holds a sequence's last key where the keys end inside it (zero-filled rows:
// TMA would read the next sequence's there). Measured with TMA at every head dim on 2026-11-27
// (bench/RESULTS.md "Hopper forward: session 19's knobs"): -1 to -18% at 64 and -7 to +1% at
// 128; at 256, +3 to +12% on every anchor row ("Hopper at 256: TMA forward and the dQ kernel").
#ifndef ATTN_FLASH_SM90_FWD_TMA
#define ATTN_FLASH_SM90_FWD_TMA 256
#endif
inline constexpr int kSm90ForwardTmaFrom = ATTN_FLASH_SM90_FWD_TMA;

// N > 0: the Hopper forward's consumer warps store O by TMA at head dims N and above, one box of
// 16 rows per warp and 64-column head-dim block where the warp's rows lie inside the sequence
// (Sm90ForwardTmaStore in tile_config.h); 128 (shipped); 0: every row through the Q slot with
// the warp's 16-byte stores at every head dim. Measured on 2026-11-27 (bench/RESULTS.md "Hopper
// forward: O stored by TMA"): +1 to +2% on 8x2048 at 128 and 256 and on 32x512 non-causal at
// 256, -1% on 32x512 causal at 256, within 2% elsewhere; at 64 -8 to -13% on 8x2048 and up to
// -9% on 32x512 (the persistent kernel), with no spills.
#ifndef ATTN_FLASH_SM90_FWD_TMA_STORE
#define ATTN_FLASH_SM90_FWD_TMA_STORE 128
#endif
inline constexpr int kSm90ForwardTmaStoreFrom = ATTN_FLASH_SM90_FWD_TMA_STORE;

// N > 0: the Hopper forward runs persistent CTAs up to N keys (max_seqlen_k) at every head dim
// (Sm90ForwardPersistentMaxKeys in tile_config.h); 0 (shipped): 2048 at head dim 64, 1024 above.
// 2048 measured at 128 (bench/RESULTS.md "Hopper forward: turns across blocks, the softmax under
// P V"): +2 to +3% on 8x2048 before the one-CTA-per-block kernel ran the softmax under P V,
// within 1.5% after.
#ifndef ATTN_FLASH_SM90_FWD_PERSISTENT_MAX_KEYS
#define ATTN_FLASH_SM90_FWD_PERSISTENT_MAX_KEYS 0
#endif
inline constexpr int kSm90ForwardPersistentMaxKeysOverride =
    ATTN_FLASH_SM90_FWD_PERSISTENT_MAX_KEYS;

}  // namespace attnserve::kernels::flash
