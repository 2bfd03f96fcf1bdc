// The flash kernels' benchmark-only tuning knobs: every one the records (bench/RESULTS.md,
// NOTES.md "Tuning knobs") show close enough to the shipped choice to be worth measuring again.
// Normal builds define none of these macros and get the shipped defaults; a benchmark build
// defines one for C++ and CUDA alike (`bench/run_gpu.sh --fwd-variant` or `--bwd-variant
// NAME=-DMACRO=VALUE`: the build's columns in the forward or the backward benchmark), and
// CI compiles each kept non-default value once (kernels/flash/CMakeLists.txt,
// attn_kernels_flash_tuning_variants). Knobs whose alternative lost are deleted, not kept here.
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
