// The grid of every dK/dV kernel (sm90, sm80/sm75, the pair kernel): one CTA per (kv head, key
// block) in x, the kv head varying fastest, and the sequence in z. The GPU dispatches CTAs in x
// order, so every head's key block 0 comes first, then every head's block 1, and so on. Under a
// causal mask the early key blocks see the most query tiles: dispatched first, the longest CTAs
// no longer finish last, as the last head's did with the key block fastest (NOTES.md "Backward:
// CTA order").
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/flash/bwd_args.h"

namespace attnserve::kernels::flash {

// This CTA's (sequence, kv head, key block).
struct DkDvCtaCoords {
  int batch, kv_head, n_block;
};
__device__ __forceinline__ DkDvCtaCoords HeadsFirstDkDvCta(const FwdKernelArgs& f) {
  const int kv_heads = f.num_heads / f.head_group;
  const int x = static_cast<int>(blockIdx.x);
  return {static_cast<int>(blockIdx.z), x % kv_heads, x / kv_heads};
}

// A persistent dK/dV kernel's blocks (Sm90BackwardRunsPersistent in tile_config.h): the grid below
// flattened, x (x_count of them per sequence) fastest, as the GPU dispatches that grid's CTAs.
struct DkDvBlocks {
  int x_count;
  int blocks;  // x_count x sequences
};
// Calls visit(coordinates) for blocks blockIdx.x, + gridDim.x, ... of `blocks`.
template <class Visit>
__device__ __forceinline__ void ForEachDkDvBlock(const FwdKernelArgs& f, const DkDvBlocks& blocks,
                                                 Visit&& visit) {
  const int kv_heads = f.num_heads / f.head_group;
  for (int64_t w = blockIdx.x; w < blocks.blocks; w += gridDim.x) {
    const int x = static_cast<int>(w % blocks.x_count);
    visit(DkDvCtaCoords{static_cast<int>(w / blocks.x_count), x % kv_heads, x / kv_heads});
  }
}

// The grid HeadsFirstDkDvCta reads, for key blocks of block_n keys; an error when the CTAs of
// one sequence would not fit in x.
inline KernelStatus HeadsFirstDkDvGrid(const FwdKernelArgs& f, const BwdGrid& grid, int block_n,
                                       dim3* blocks) {
  const int64_t key_blocks = (int64_t{grid.max_seqlen_k} + block_n - 1) / block_n;
  const int64_t ctas = key_blocks * (f.num_heads / f.head_group);
  if (ctas > std::numeric_limits<int>::max()) {
    return KernelStatus::Error(
        "flash: backward needs " + std::to_string(ctas) +
        " CTAs per sequence (key blocks x kv heads), over the grid's limit of " +
        std::to_string(std::numeric_limits<int>::max()) + " in x");
  }
  *blocks = dim3(static_cast<unsigned>(ctas), 1, static_cast<unsigned>(grid.batch));
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::flash
