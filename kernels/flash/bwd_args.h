// What the flash backward kernels get by value: the forward's arguments (inputs, masks, score
// scales) plus the gradient tensors and the float32 D = rowsum(dO * O) scratch.
#pragma once

#include <cstdint>

#include "kernels/flash/fwd_args.h"

namespace attnserve::kernels::flash {

struct BwdKernelArgs {
  // q, k, v, out (read only here), lse (read only), cu_seqlens, strides, windows and the score
  // scales exactly as the forward that produced out and lse used them.
  FwdKernelArgs fwd;
  const void* dout;  // [total_q, num_heads, head_dim]
  void* dq;          // [total_q, num_heads, head_dim]
  void* dk;          // [total_k, num_heads_k, head_dim]
  void* dv;          // [total_k, num_heads_k, head_dim]
  float* dsum;       // [num_heads, total_q]: D = rowsum(dO * O), written by the preprocess kernel
  // Non-deterministic mode: float32 dQ (unscaled), zeroed, summed with atomics by the dK/dV
  // kernel and converted into dq: [total_q, num_heads, head_dim] on the sm80 path and the Hopper
  // one at 256, by tile at 64 / 128 / 192 (bwd_sm90_dq_tiles.h); nullptr in deterministic mode
  // (the dQ kernel writes dq).
  float* dq_accum;
  float lse_log2_scale;  // log2(e): lse is natural log, the kernels work in base 2
  float grad_scale;  // d score / d (q.k) = softmax_scale (times 1 - tanh^2 with softcap)
};

struct BwdGrid {
  int batch;
  int max_seqlen_q;
  int max_seqlen_k;
  // Shared memory a block may use on this device (its opt-in limit, or the emulated
  // architecture's): the launcher runs the wide dK/dV kernel only where it fits.
  int smem_limit;
  int multiprocessors;  // the device's SMs (a persistent dK/dV kernel's CTAs)
};

}  // namespace attnserve::kernels::flash
