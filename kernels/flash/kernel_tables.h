// The flash dispatcher's tables of compiled launchers (flash_attention.cc only): one row per
// instantiated head dim and path, filled from the generated instantiations/*.inc, and their
// lookups. Only flash_attention.cc includes it (hence the anonymous namespace).
#pragma once

#include <cstddef>

#include "kernels/flash/bwd_launch.h"
#include "kernels/flash/fwd_launch.h"

namespace attnserve::kernels::flash {
namespace {

using LaunchFn = KernelStatus (*)(const FwdKernelArgs&, const FwdGrid&, cudaStream_t);

struct KernelEntry {
  int head_dim;
  LaunchFn fp16;
  LaunchFn bf16;
};

// The instantiated kernels this build holds (ATTN_HEAD_DIMS), ascending head dim.
constexpr KernelEntry kKernels[] = {
#include "kernels/flash/instantiations/kernel_table.inc"
};

using BackwardLaunchFn = KernelStatus (*)(const BwdKernelArgs&, const BwdGrid&, cudaStream_t);

struct BackwardKernelEntry {
  int head_dim;
  BackwardLaunchFn fp16;
  BackwardLaunchFn bf16;
};

// The instantiated backward kernels (ATTN_HEAD_DIMS up to kMaxBackwardHeadDim), ascending.
constexpr BackwardKernelEntry kBackwardKernels[] = {
#include "kernels/flash/instantiations/bwd_kernel_table.inc"
};

// The sm80 kernels with dropout and ALiBi (kernels/gpu_extras.h), as kKernels and kBackwardKernels.
using ExtrasLaunchFn = KernelStatus (*)(const FwdKernelArgsX&, const FwdGrid&, cudaStream_t);
using ExtrasBackwardLaunchFn = KernelStatus (*)(const BwdKernelArgsX&, const BwdGrid&,
                                                cudaStream_t);
struct ExtrasKernelEntry {
  int head_dim;
  ExtrasLaunchFn fp16;
  ExtrasLaunchFn bf16;
};
struct ExtrasBackwardKernelEntry {
  int head_dim;
  ExtrasBackwardLaunchFn fp16;
  ExtrasBackwardLaunchFn bf16;
};
constexpr ExtrasKernelEntry kExtrasKernels[] = {
#include "kernels/flash/instantiations/x_kernel_table.inc"
};
constexpr ExtrasBackwardKernelEntry kExtrasBackwardKernels[] = {
#include "kernels/flash/instantiations/x_bwd_kernel_table.inc"
};

// The extras kernel of exactly `head_dim` (an instantiated one; both tables list the same).
template <typename Entry, size_t kCount>
const Entry* FindExact(const Entry (&table)[kCount], int head_dim) {
  for (const Entry& entry : table) {
    if (entry.head_dim == head_dim) return &entry;
  }
  return nullptr;
}

// The Hopper (sm90, wgmma) forward kernels this build holds (ATTN_HEAD_DIMS of 64, 128, 256,
// when it targets sm_90), ascending head dim, then a sentinel that matches no head dim.
constexpr KernelEntry kSm90Kernels[] = {
#include "kernels/flash/instantiations/sm90_kernel_table.inc"
    {0, nullptr, nullptr}};

// The Hopper (sm90, wgmma) backward kernels this build holds (ATTN_HEAD_DIMS of 64, 128, 192 and
// 256, when it targets sm_90), ascending head dim, then a sentinel that matches no head dim.
constexpr BackwardKernelEntry kSm90BackwardKernels[] = {
#include "kernels/flash/instantiations/sm90_bwd_kernel_table.inc"
    {0, nullptr, nullptr}};

struct TuringKernelEntry {
  int head_dim;
  LaunchFn forward;  // fp16
  BackwardLaunchFn backward;
};

// The Turing (sm75) path's kernels (ATTN_HEAD_DIMS of 32 and 64), ascending head dim, then a
// sentinel that matches no head dim (the list may be empty).
constexpr TuringKernelEntry kTuringKernels[] = {
#include "kernels/flash/instantiations/sm75_kernel_table.inc"
    {0, nullptr, nullptr}};


const KernelEntry* FindKernel(int head_dim) {
  for (const KernelEntry& entry : kKernels) {
    if (entry.head_dim >= head_dim) return &entry;
  }
  return nullptr;
}

const BackwardKernelEntry* FindBackwardKernel(int head_dim) {
  for (const BackwardKernelEntry& entry : kBackwardKernels) {
    if (entry.head_dim >= head_dim) return &entry;
  }
  return nullptr;
}

// The sm90 forward for exactly `head_dim` (the sm80 kernel's instantiated head dim, so both
// paths pad the same way), or null: head dims without one run the sm80 kernel.
const KernelEntry* FindSm90Kernel(int head_dim) {
  for (const KernelEntry& entry : kSm90Kernels) {
    if (entry.head_dim == head_dim) return &entry;
  }
  return nullptr;
}

// The sm90 backward for exactly `head_dim` (the sm80 backward's instantiated head dim), or null.
const BackwardKernelEntry* FindSm90BackwardKernel(int head_dim) {
  for (const BackwardKernelEntry& entry : kSm90BackwardKernels) {
    if (entry.head_dim == head_dim) return &entry;
  }
  return nullptr;
}

const TuringKernelEntry* FindTuringKernel(int head_dim) {
  for (const TuringKernelEntry& entry : kTuringKernels) {
    if (entry.head_dim >= head_dim) return &entry;
  }
  return nullptr;
}

}  // namespace
}  // namespace attnserve::kernels::flash
