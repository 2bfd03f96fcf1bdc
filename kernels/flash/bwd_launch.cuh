// Definition of LaunchBackward, included by the generated instantiation files only. Deterministic
// mode: preprocess (D), dK/dV kernel, dQ kernel. Otherwise: zero the float32 dQ workspace,
// preprocess, dK/dV kernel with atomic dQ, conversion of dQ to the element type.
#pragma once

#include <string>

#include "kernels/flash/bwd_dkdv_kernel.cuh"
#include "kernels/flash/bwd_dq_kernel.cuh"
#include "kernels/flash/bwd_launch.h"
#include "kernels/flash/bwd_preprocess.cuh"
#include "kernels/flash/fwd_launch.cuh"

namespace attnserve::kernels::flash {

inline KernelStatus BackwardLaunchError(const char* what, cudaError_t err) {
  return KernelStatus::Error(std::string("flash: backward ") + what + " failed: " +
                             cudaGetErrorString(err));
}

template <class Arch, DType kDType, int kHeadDim>
KernelStatus LaunchBackward(const BwdKernelArgs& args, const BwdGrid& grid, cudaStream_t stream) {
  using T = BwdTraits<Arch, kDType, kHeadDim>;
  const bool atomic_dq = args.dq_accum != nullptr;
  const auto dkdv = atomic_dq ? &FlashBackwardDkDvKernel<Arch, kDType, kHeadDim, true>
                              : &FlashBackwardDkDvKernel<Arch, kDType, kHeadDim, false>;
  const auto dq = &FlashBackwardDqKernel<Arch, kDType, kHeadDim>;
  if constexpr (T::kSmemBytes > kDefaultSmemLimit) {
    cudaError_t err =
        cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (err == cudaSuccess && !atomic_dq) {
      err = cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    }
    if (err != cudaSuccess) return BackwardLaunchError("cudaFuncSetAttribute", err);
  }
  const int64_t pairs = args.fwd.total_q * args.fwd.num_heads;
  const int64_t dq_elems = pairs * args.fwd.head_dim;
  if (atomic_dq && dq_elems > 0) {
    const cudaError_t err =
        cudaMemsetAsync(args.dq_accum, 0, static_cast<size_t>(dq_elems) * 4, stream);
    if (err != cudaSuccess) return BackwardLaunchError("cudaMemsetAsync", err);
  }
  if (pairs > 0) {
    const int64_t blocks = (pairs + kPreprocessRowsPerBlock - 1) / kPreprocessRowsPerBlock;
    FlashBackwardPreprocessKernel<kDType>
        <<<static_cast<unsigned>(blocks), kPreprocessThreads, 0, stream>>>(args);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardLaunchError("preprocess launch", err);
  }
  if (grid.max_seqlen_k > 0) {
    const dim3 blocks((grid.max_seqlen_k + T::kBlock - 1) / T::kBlock,
                      args.fwd.num_heads / args.fwd.head_group, grid.batch);
    dkdv<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardLaunchError("dK/dV launch", err);
  }
  if (atomic_dq && dq_elems > 0) {
    const int64_t blocks = (dq_elems / 8 + kConvertThreads - 1) / kConvertThreads;
    FlashBackwardConvertDqKernel<kDType><<<static_cast<unsigned>(blocks), kConvertThreads, 0,
                                           stream>>>(args.dq_accum, args.dq, dq_elems,
                                                     args.grad_scale);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardLaunchError("dQ conversion launch", err);
  } else if (!atomic_dq && grid.max_seqlen_q > 0) {
    const dim3 blocks((grid.max_seqlen_q + T::kBlock - 1) / T::kBlock, args.fwd.num_heads,
                      grid.batch);
    dq<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardLaunchError("dQ launch", err);
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::flash
