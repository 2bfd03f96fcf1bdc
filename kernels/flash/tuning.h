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
// tile of its block, masking what its rows do not see. Measured 2026-11-27 (bench/RESULTS.md
// "Hopper forward: session 19's knobs"): +4 to +6% on some causal and varlen rows at head dim
// 64, -2 to -5% at 128 and 256, so not the default. What it saves: at head dim 64 (192-row
// blocks, 128-key tiles) 32x512 causal computes 27 warpgroup tiles per (head, sequence) where
// 20 hold a key some row sees; on longer rows the diagonal tiles of causal blocks.
#ifndef ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS
#define ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS 0
#endif
inline constexpr bool kSm90ForwardWarpgroupKeys = ATTN_FLASH_SM90_FWD_WARPGROUP_KEYS != 0;

// N > 0: the Hopper forward's producer loads by TMA at head dims N and above (Sm90ForwardTma in
// tile_config.h); 0 (shipped): cp.async from its 128 threads everywhere. TMA: Q, K and V tiles
// by one thread, tensor maps made on the host per launch (sm90_tensor_maps.h), each tile's bytes
// counted on its full barrier, and cp.async only for the tile that holds a sequence's last key
// where the keys end inside it (zero-filled rows: TMA would read the next sequence's there).
// Measured 2026-11-27 with TMA at every head dim (bench/RESULTS.md "Hopper forward: session 19's
// knobs"): +3 to +11% at 256 on rows of 2048 keys or more, -1 to -18% at 64 and -7 to +1% at
// 128. To ship at 256 once the GPU suite and compute-sanitizer pass on a build with =256.
#ifndef ATTN_FLASH_SM90_FWD_TMA
#define ATTN_FLASH_SM90_FWD_TMA 0
#endif
inline constexpr int kSm90ForwardTmaFrom = ATTN_FLASH_SM90_FWD_TMA;

// 1: the Hopper backward at head dim 256 computes dQ in a kernel of its own
// (bwd_sm90_dq_kernel.cuh: per 128-row query block, S and dP recomputed, dQ += dS K on wgmma,
// written once), and its dK/dV kernel does no dQ work; 0 (shipped): the dK/dV kernel adds dQ
// into a float32 workspace (red.global.add per element pair) that a conversion kernel rounds.
// Not measured yet. Why it may pay: the dK/dV kernel ran 2.7x faster with its dQ reductions
// skipped (bench/RESULTS.md "Why two tiles apart, and where the time goes").
#ifndef ATTN_FLASH_SM90_BWD_DQ_KERNEL
#define ATTN_FLASH_SM90_BWD_DQ_KERNEL 0
#endif
inline constexpr bool kSm90BackwardDqKernel = ATTN_FLASH_SM90_BWD_DQ_KERNEL != 0;

}  // namespace attnserve::kernels::flash
