// Definition of LaunchForwardSm90, included by the generated sm90 instantiation files only.
#pragma once

#include <string>

#include "kernels/flash/fwd_launch.h"
#include "kernels/flash/fwd_sm90_kernel.cuh"

namespace attnserve::kernels::flash {

template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardSm90(const FwdKernelArgs& args, const FwdGrid& grid,
                               cudaStream_t stream) {
  using T = FwdSm90Traits<kDType, kHeadDim>;
  const auto kernel = &FlashForwardSm90Kernel<kDType, kHeadDim>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (err != cudaSuccess) {
    return KernelStatus::Error(std::string("flash: cudaFuncSetAttribute failed: ") +
                               cudaGetErrorString(err));
  }
  const dim3 blocks((grid.max_seqlen_q + T::kBlockM - 1) / T::kBlockM, args.num_heads,
                    grid.batch);
  kernel<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
  err = cudaGetLastError();
  if (err != cudaSuccess) {
    return KernelStatus::Error(std::string("flash: sm90 forward launch failed: ") +
                               cudaGetErrorString(err));
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::flash
