// Shared memory per block that the flash kernels need, in plain C++ (no CUDA), so the router
// (server/engine/kernel_routing.cc) can send what a device cannot fit to another family before
// the dispatcher (flash_attention.cc) would refuse it. An A100 gives a block 163 KB, sm86/89
// 99 KB, an H100 227 KB, Turing 64 KB.
#pragma once

#include "kernels/flash/arch.h"
#include "kernels/flash/tile_config.h"

namespace attnserve::kernels::flash {

// Bytes per block the kernel serving `head_dim` (rounded up to an instantiated head dim, as the
// dispatcher does) needs on the code path of `compute_capability` (the Turing path below 8.0);
// 0 when no flash kernel serves that head dim in that direction.
inline int SharedMemoryBytes(bool backward, int head_dim, int compute_capability) {
  const bool turing = compute_capability < Sm80::kComputeCapability;
  const int max_head_dim =
      turing ? Sm75::kMaxHeadDim : (backward ? kMaxBackwardHeadDim : kMaxHeadDim);
  for (int dim : kInstantiatedHeadDims) {
    if (dim < head_dim) continue;
    if (dim > max_head_dim) return 0;
    if (turing) return backward ? BackwardSmemBytes<Sm75>(dim) : ForwardSmemBytes<Sm75>(dim);
    return backward ? BackwardSmemBytes<Sm80>(dim) : ForwardSmemBytes<Sm80>(dim);
  }
  return 0;
}

}  // namespace attnserve::kernels::flash
