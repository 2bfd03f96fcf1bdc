// Definition of LaunchBackward, included by the generated instantiation files only. Deterministic
// mode: preprocess (D), dK/dV kernel, dQ kernel. Otherwise: zero the float32 dQ workspace,
// preprocess, dK/dV kernel with atomic dQ, conversion of dQ to the element type.
#pragma once

#include <string>

#include "kernels/flash/bwd_cta_order.cuh"
#include "kernels/flash/bwd_dkdv_kernel.cuh"
#include "kernels/flash/bwd_dkdv_pair_kernel.cuh"
#include "kernels/flash/bwd_dq_kernel.cuh"
#include "kernels/flash/bwd_launch.h"
#include "kernels/flash/bwd_preprocess.cuh"
#include "kernels/flash/fwd_launch.cuh"

namespace attnserve::kernels::flash {

inline KernelStatus BackwardLaunchError(const char* what, cudaError_t err) {
  return KernelStatus::Error(std::string("flash: backward ") + what + " failed: " +
                             cudaGetErrorString(err));
}

// The backward with the wide or the narrow dK/dV kernel (and the dQ pass of that variant);
// kExtras: the dropout/ALiBi instantiations (extras_args.h).
template <class Arch, DType kDType, int kHeadDim, bool kWide, bool kExtras>
KernelStatus LaunchBackwardWith(const BwdArgsOf<kExtras>& args, const BwdGrid& grid,
                                cudaStream_t stream) {
  using T = BwdDkDvTraits<Arch, kDType, kHeadDim, kWide>;
  using TDq = BwdDqTraits<Arch, kDType, kHeadDim, kWide>;
  const bool atomic_dq = args.dq_accum != nullptr;
  void (*dkdv)(BwdArgsOf<kExtras>);
  if constexpr (T::kPair) {
    dkdv = atomic_dq ? &FlashBackwardDkDvPairKernel<Arch, kDType, kHeadDim, kWide, true, kExtras>
                     : &FlashBackwardDkDvPairKernel<Arch, kDType, kHeadDim, kWide, false, kExtras>;
  } else {
    dkdv = atomic_dq ? &FlashBackwardDkDvKernel<Arch, kDType, kHeadDim, kWide, true, kExtras>
                     : &FlashBackwardDkDvKernel<Arch, kDType, kHeadDim, kWide, false, kExtras>;
  }
  const auto dq = &FlashBackwardDqKernel<Arch, kDType, kHeadDim, kWide, kExtras>;
  cudaError_t attr_err = cudaSuccess;
  if constexpr (T::kSmemBytes > kDefaultSmemLimit) {
    attr_err =
        cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  }
  if constexpr (TDq::kSmemBytes > kDefaultSmemLimit) {
    if (attr_err == cudaSuccess && !atomic_dq) {
      attr_err =
          cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, TDq::kSmemBytes);
    }
  }
  if (attr_err != cudaSuccess) return BackwardLaunchError("cudaFuncSetAttribute", attr_err);
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
        <<<static_cast<unsigned>(blocks), kPreprocessThreads, 0, stream>>>(
            static_cast<const BwdKernelArgs&>(args));  // D needs no extras: O is the dropped output
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardLaunchError("preprocess launch", err);
  }
  if (grid.max_seqlen_k > 0) {
    dim3 blocks;
    if (KernelStatus s = HeadsFirstDkDvGrid(args.fwd, grid, T::kResidentRows, &blocks); !s.ok) {
      return s;
    }
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
    const dim3 blocks((grid.max_seqlen_q + TDq::kResidentRows - 1) / TDq::kResidentRows,
                      args.fwd.num_heads, grid.batch);
    dq<<<blocks, TDq::kThreads, TDq::kSmemBytes, stream>>>(args);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardLaunchError("dQ launch", err);
  }
  return KernelStatus::Ok();
}

// Wide where the device holds it (H100: 227 KB per block), narrow elsewhere (A100, sm86/89).
template <class Arch, DType kDType, int kHeadDim, bool kExtras>
KernelStatus LaunchBackwardOf(const BwdArgsOf<kExtras>& args, const BwdGrid& grid,
                              cudaStream_t stream) {
  if constexpr (BackwardHasNarrow<Arch>(kHeadDim)) {
    if (grid.smem_limit < BackwardSmemBytes<Arch>(kHeadDim, true)) {
      return LaunchBackwardWith<Arch, kDType, kHeadDim, false, kExtras>(args, grid, stream);
    }
  }
  return LaunchBackwardWith<Arch, kDType, kHeadDim, true, kExtras>(args, grid, stream);
}

template <class Arch, DType kDType, int kHeadDim>
KernelStatus LaunchBackward(const BwdKernelArgs& args, const BwdGrid& grid, cudaStream_t stream) {
  return LaunchBackwardOf<Arch, kDType, kHeadDim, false>(args, grid, stream);
}

template <DType kDType, int kHeadDim>
KernelStatus LaunchBackwardExtras(const BwdKernelArgsX& args, const BwdGrid& grid,
                                  cudaStream_t stream) {
  return LaunchBackwardOf<Sm80, kDType, kHeadDim, true>(args, grid, stream);
}

}  // namespace attnserve::kernels::flash
