// Definition of LaunchForwardSm90, included by the generated sm90 instantiation files only.
#pragma once

#include "kernels/flash/fwd_launch.cuh"
#include "kernels/flash/fwd_sm90_kernel.cuh"

namespace attnserve::kernels::flash {

template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardSm90(const FwdKernelArgs& args, const FwdGrid& grid,
                               cudaStream_t stream) {
  using T = FwdSm90Traits<kDType, kHeadDim>;
  return LaunchForwardGrid(&FlashForwardSm90Kernel<kDType, kHeadDim>, args, grid, T::kBlockM,
                           T::kThreads, T::kSmemBytes, stream, "sm90 forward");
}

}  // namespace attnserve::kernels::flash
