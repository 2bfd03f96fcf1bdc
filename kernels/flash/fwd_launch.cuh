// Definition of LaunchForward, included by the generated instantiation files only.
#pragma once

#include <string>

#include "kernels/flash/fwd_kernel.cuh"
#include "kernels/flash/fwd_launch.h"

namespace attnserve::kernels::flash {

// Shared memory a kernel may use without opting in.
inline constexpr int kDefaultSmemLimit = 48 * 1024;

// Opts `kernel` in to smem_bytes of dynamic shared memory where it needs more than the default.
template <typename Kernel>
KernelStatus AllowForwardSmem(Kernel kernel, int smem_bytes) {
  if (smem_bytes <= kDefaultSmemLimit) return KernelStatus::Ok();
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) return KernelStatus::Ok();
  return KernelStatus::Error(std::string("flash: cudaFuncSetAttribute failed: ") +
                             cudaGetErrorString(err));
}

// The launch just made: its error, if any, with `what` naming the kernel.
inline KernelStatus ForwardLaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return KernelStatus::Ok();
  return KernelStatus::Error(std::string("flash: ") + what + " launch failed: " +
                             cudaGetErrorString(err));
}

// Launches `kernel` on one CTA per (query block, head, sequence) with `args` and any `more`
// parameters, opting in to its dynamic shared memory where it needs more than the default;
// `what` names it in errors. The sm80/sm75 and the Hopper forward launchers share it.
template <typename Kernel, typename Args, typename... More>
KernelStatus LaunchForwardGrid(Kernel kernel, const Args& args, const FwdGrid& grid,
                               int block_m, int threads, int smem_bytes, cudaStream_t stream,
                               const char* what, const More&... more) {
  if (KernelStatus status = AllowForwardSmem(kernel, smem_bytes); !status.ok) return status;
  const dim3 blocks((grid.max_seqlen_q + block_m - 1) / block_m, args.num_heads, grid.batch);
  kernel<<<blocks, threads, smem_bytes, stream>>>(args, more...);
  return ForwardLaunchStatus(what);
}

template <class Arch, DType kDType, int kHeadDim>
KernelStatus LaunchForward(const FwdKernelArgs& args, const FwdGrid& grid, cudaStream_t stream) {
  using T = FwdTraits<Arch, kDType, kHeadDim>;
  return LaunchForwardGrid(&FlashForwardKernel<Arch, kDType, kHeadDim>, args, grid, T::kBlockM,
                           T::kThreads, T::kSmemBytes, stream, "forward");
}

template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardExtras(const FwdKernelArgsX& args, const FwdGrid& grid,
                                 cudaStream_t stream) {
  using T = FwdTraits<Sm80, kDType, kHeadDim>;
  return LaunchForwardGrid(&FlashForwardKernel<Sm80, kDType, kHeadDim, true>, args, grid,
                           T::kBlockM, T::kThreads, T::kSmemBytes, stream,
                           "forward (dropout/ALiBi)");
}

}  // namespace attnserve::kernels::flash
