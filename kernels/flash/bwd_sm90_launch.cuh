// Definition of LaunchBackwardSm90, included by the generated sm90 backward instantiation files
// only: zero the float32 dQ workspace, the preprocess (D), the Hopper dK/dV kernel with atomic
// dQ (bwd_sm90_kernel.cuh at head dims 64 / 128, bwd_sm90_wide_kernel.cuh at 192 / 256), the dQ
// conversion (the sm80 path's preprocess, and its conversion kernel at 256 or the tile layout's
// at 64 / 128 / 192, bwd_sm90_dq_tiles.cuh). Where the dK/dV kernel computes no dQ (256 with
// ATTN_FLASH_SM90_BWD_DQ_KERNEL): the preprocess, the dK/dV kernel, then the dQ kernel
// (bwd_sm90_dq_kernel.cuh), no workspace.
#pragma once

#include <string>

#include "kernels/flash/bwd_launch.h"
#include "kernels/flash/bwd_preprocess.cuh"
#include "kernels/flash/bwd_sm90_dq_kernel.cuh"
#include "kernels/flash/bwd_sm90_dq_tiles.cuh"
#include "kernels/flash/bwd_sm90_kernel.cuh"
#include "kernels/flash/bwd_sm90_wide_kernel.cuh"

namespace attnserve::kernels::flash {

inline KernelStatus BackwardSm90LaunchError(const char* what, cudaError_t err) {
  return KernelStatus::Error(std::string("flash: sm90 backward ") + what + " failed: " +
                             cudaGetErrorString(err));
}

// The dQ kernel, one CTA per (128-row query block, head, sequence).
template <DType kDType, int kHeadDim>
KernelStatus LaunchBackwardDqSm90(const BwdKernelArgs& args, const BwdGrid& grid,
                                  cudaStream_t stream) {
  using T = BwdSm90DqTraits<kDType, kHeadDim>;
  if (grid.max_seqlen_q == 0) return KernelStatus::Ok();
  const auto kernel = &FlashBackwardDqSm90Kernel<kDType, kHeadDim>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (err != cudaSuccess) return BackwardSm90LaunchError("dQ cudaFuncSetAttribute", err);
  const dim3 blocks((grid.max_seqlen_q + T::kBlockM - 1) / T::kBlockM, args.fwd.num_heads,
                    grid.batch);
  kernel<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
  err = cudaGetLastError();
  if (err != cudaSuccess) return BackwardSm90LaunchError("dQ launch", err);
  return KernelStatus::Ok();
}

// The atomic-dQ mode only: the dispatcher runs the deterministic mode on the sm80 path. T: the
// dK/dV kernel's traits (kBlockN keys per CTA, kThreads, kSmemBytes).
template <class T, DType kDType>
KernelStatus LaunchBackwardSm90With(void (*dkdv)(BwdKernelArgs), const BwdKernelArgs& args,
                                    const BwdGrid& grid, cudaStream_t stream) {
  constexpr bool kFusedDq = T::kFusedDq;
  if (kFusedDq && args.dq_accum == nullptr && args.fwd.total_q > 0) {
    return KernelStatus::Error("flash: sm90 backward needs the dQ workspace (atomic mode)");
  }
  cudaError_t err =
      cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (err != cudaSuccess) return BackwardSm90LaunchError("cudaFuncSetAttribute", err);
  const int64_t pairs = args.fwd.total_q * args.fwd.num_heads;
  const int64_t dq_elems = pairs * args.fwd.head_dim;
  // The dQ workspace: laid out like dq, or by tile (bwd_sm90_dq_tiles.h).
  constexpr bool kTileDq = T::kDqStageBytes > 0;
  const int64_t workspace_floats =
      kTileDq ? TileDqWorkspaceFloats(args.fwd.total_q, grid.batch, args.fwd.num_heads,
                                      T::kHeadDim)
              : dq_elems;
  if (kFusedDq && dq_elems > 0) {
    err = cudaMemsetAsync(args.dq_accum, 0, static_cast<size_t>(workspace_floats) * 4, stream);
    if (err != cudaSuccess) return BackwardSm90LaunchError("cudaMemsetAsync", err);
  }
  if (pairs > 0) {
    const int64_t blocks = (pairs + kPreprocessRowsPerBlock - 1) / kPreprocessRowsPerBlock;
    FlashBackwardPreprocessKernel<kDType>
        <<<static_cast<unsigned>(blocks), kPreprocessThreads, 0, stream>>>(args);
    err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardSm90LaunchError("preprocess launch", err);
  }
  if (grid.max_seqlen_k > 0) {
    dim3 blocks;
    if (KernelStatus s = HeadsFirstDkDvGrid(args.fwd, grid, T::kBlockN, &blocks); !s.ok) return s;
    dkdv<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
    err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardSm90LaunchError("dK/dV launch", err);
  }
  if constexpr (!kFusedDq) {
    return LaunchBackwardDqSm90<kDType, T::kHeadDim>(args, grid, stream);
  }
  if (dq_elems > 0) {
    if constexpr (kTileDq) {
      const dim3 blocks((grid.max_seqlen_q + kTileDqRows - 1) / kTileDqRows, args.fwd.num_heads,
                        grid.batch);
      FlashBackwardConvertTileDqKernel<kDType, T::kHeadDim>
          <<<blocks, kTileDqConvertThreads, 0, stream>>>(args);
    } else {
      const int64_t blocks = (dq_elems / 8 + kConvertThreads - 1) / kConvertThreads;
      FlashBackwardConvertDqKernel<kDType><<<static_cast<unsigned>(blocks), kConvertThreads, 0,
                                             stream>>>(args.dq_accum, args.dq, dq_elems,
                                                       args.grad_scale);
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardSm90LaunchError("dQ conversion launch", err);
  }
  return KernelStatus::Ok();
}

template <DType kDType, int kHeadDim>
KernelStatus LaunchBackwardSm90(const BwdKernelArgs& args, const BwdGrid& grid,
                                cudaStream_t stream) {
  if constexpr (kHeadDim > 128) {
    return LaunchBackwardSm90With<BwdSm90WideTraits<kDType, kHeadDim>, kDType>(
        &FlashBackwardDkDvSm90WideKernel<kDType, kHeadDim>, args, grid, stream);
  } else {
    return LaunchBackwardSm90With<BwdSm90Traits<kDType, kHeadDim>, kDType>(
        &FlashBackwardDkDvSm90Kernel<kDType, kHeadDim>, args, grid, stream);
  }
}

}  // namespace attnserve::kernels::flash
