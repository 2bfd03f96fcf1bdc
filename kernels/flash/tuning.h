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
// block, 2 otherwise). A third stage at 64 measured 0 to -2% (bench/RESULTS.md "Hopper forward,
// warp specialized", st3), but with the 128-row tile of then, not the 192 rows that ship now.
#ifndef ATTN_FLASH_SM90_FWD_STAGES
#define ATTN_FLASH_SM90_FWD_STAGES 0
#endif
inline constexpr int kSm90ForwardStagesOverride = ATTN_FLASH_SM90_FWD_STAGES;

// 1: each consumer warpgroup of the Hopper forward computes only the key tiles its own 64 rows
// see (BlockRowsKeyTiles in fwd_block.cuh) and passes over the block's others, taking its
// ping-pong turn and releasing their stages; 0 (shipped): every warpgroup computes every key
// tile of its block, masking what its rows do not see. Not measured yet. What it can save: at
// head dim 64 (192-row blocks, 128-key tiles) 32x512 causal computes 27 warpgroup tiles per
// (head, sequence) where 20 hold a key some row sees, 32x512 non-causal 36 where 32 do (the
// last block's third warpgroup lies past the sequence); on longer rows the diagonal tiles of
// causal blocks, and at 256 (80-key tiles) the top warpgroup's last tile where the diagonal
// crosses into it.
#ifndef ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS
#define ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS 0
#endif
inline constexpr bool kSm90ForwardWarpgroupKeys = ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS != 0;

// 1: the Hopper forward's producer loads Q, K and V tiles with TMA (one thread, tensor maps made
// on the host per launch: sm90_tensor_maps.h), each tile's bytes counted on its full barrier,
// and with cp.async only the tile that holds a sequence's last key where the keys end inside
// it (zero-filled rows: TMA would read the next sequence's there); 0 (shipped): every tile by
// cp.async from the 128 producer threads. Not measured yet: TMA frees the producer's issue
// slots and registers (its 128 threads issue 16-40 16-byte copies per K or V tile now).
#ifndef ATTN_FLASH_SM90_FWD_TMA
#define ATTN_FLASH_SM90_FWD_TMA 0
#endif
inline constexpr bool kSm90ForwardTma = ATTN_FLASH_SM90_FWD_TMA != 0;

}  // namespace attnserve::kernels::flash
