// What the flash forward kernel gets by value: the arguments every GPU family's forward gets
// (kernels/gpu_attention_args.h).
#pragma once

#include <cstdint>

#include "kernels/gpu_attention_args.h"

namespace attnserve::kernels::flash {

using FwdKernelArgs = GpuAttentionArgs;

// The persistent Hopper forward's schedule (fwd_sm90_ring.cuh, ForEachForwardBlock): query
// blocks per (head, sequence), and of all heads and sequences together.
struct FwdSm90Grid {
  int m_blocks;
  int blocks;
};

}  // namespace attnserve::kernels::flash
