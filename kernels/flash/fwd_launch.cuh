// Definition of LaunchForward, included by the generated instantiation files only.
#pragma once

#include <string>

#include "kernels/flash/fwd_kernel.cuh"
#include "kernels/flash/fwd_launch.h"

namespace attnserve::kernels::flash {

// Shared memory a kernel may use without opting in.
inline constexpr int kDefaultSmemLimit = 48 * 1024;

template <class Arch, DType kDType, int kHeadDim>
KernelStatus LaunchForward(const FwdKernelArgs& args, const FwdGrid& grid, cudaStream_t stream) {
  using T = FwdTraits<Arch, kDType, kHeadDim>;
  const auto kernel = &FlashForwardKernel<Arch, kDType, kHeadDim>;
  if constexpr (T::kSmemBytes > kDefaultSmemLimit) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (err != cudaSuccess) {
      return KernelStatus::Error(std::string("flash: cudaFuncSetAttribute failed: ") +
                                 cudaGetErrorString(err));
    }
  }
  const dim3 blocks((grid.max_seqlen_q + T::kBlockM - 1) / T::kBlockM, args.num_heads,
                    grid.batch);
  kernel<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return KernelStatus::Error(std::string("flash: forward launch failed: ") +
                               cudaGetErrorString(err));
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::flash
