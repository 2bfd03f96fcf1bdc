// Definition of LaunchBackwardSm90, included by the generated sm90 backward instantiation files
// only. The atomic-dQ mode at 64 / 128 / 192: zero the float32 dQ workspace, the preprocess (D;
// the sm80 path's), the Hopper dK/dV kernel adding dQ by tile (bwd_sm90_kernel.cuh at 64 / 128,
// bwd_sm90_wide_kernel.cuh at 192), the tile layout's dQ conversion (bwd_sm90_dq_tiles.cuh).
// The deterministic mode, and both modes at 256 (Sm90BackwardSeparateDq): the preprocess, the
// dK/dV kernel without dQ, then the dQ kernel (bwd_sm90_dq_kernel.cuh), no dQ workspace.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
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

// T: the dK/dV kernel's traits (kBlockN keys per CTA, kThreads, kSmemBytes, kFusedDq: whether
// it adds dQ into the workspace, which LaunchBackwardSm90 picks only with one, or the dQ kernel
// runs after it; kPersistent: the kernel takes the key blocks flattened, DkDvBlocks, over at most
// one CTA per SM).
template <class T, DType kDType, class DkDvKernel>
KernelStatus LaunchBackwardSm90With(DkDvKernel dkdv, const BwdKernelArgs& args,
                                    const BwdGrid& grid, cudaStream_t stream) {
  constexpr bool kFusedDq = T::kFusedDq;
  static_assert(!kFusedDq || T::kDqStageBytes > 0, "fused dQ is dQ by tile");
  const int64_t pairs = args.fwd.total_q * args.fwd.num_heads;
  const int64_t dq_elems = pairs * args.fwd.head_dim;
  cudaError_t err =
      cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (err != cudaSuccess) return BackwardSm90LaunchError("cudaFuncSetAttribute", err);
  if (kFusedDq && dq_elems > 0) {
    // The dQ workspace, laid out by tile (bwd_sm90_dq_tiles.h).
    const int64_t workspace_floats =
        TileDqWorkspaceFloats(args.fwd.total_q, grid.batch, args.fwd.num_heads, T::kHeadDim);
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
    if constexpr (T::kPersistent) {
      // The same blocks, flattened: one CTA per SM at most (its shared memory allows one).
      const int64_t all = int64_t{blocks.x} * blocks.z;
      if (all > INT_MAX) {
        return KernelStatus::Error("flash: sm90 persistent backward: " + std::to_string(all) +
                                   " key blocks (kv heads x key blocks x sequences) exceed " +
                                   std::to_string(INT_MAX));
      }
      const int ctas =
          static_cast<int>(std::min<int64_t>(all, std::max(grid.multiprocessors, 1)));
      dkdv<<<ctas, T::kThreads, T::kSmemBytes, stream>>>(
          args, DkDvBlocks{static_cast<int>(blocks.x), static_cast<int>(all)});
    } else {
      dkdv<<<blocks, T::kThreads, T::kSmemBytes, stream>>>(args);
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return BackwardSm90LaunchError("dK/dV launch", err);
  }
  if constexpr (!kFusedDq) {
    return LaunchBackwardDqSm90<kDType, T::kHeadDim>(args, grid, stream);
  } else {
    if (dq_elems > 0) {
      const dim3 blocks((grid.max_seqlen_q + kTileDqRows - 1) / kTileDqRows,
                        args.fwd.num_heads, grid.batch);
      FlashBackwardConvertTileDqKernel<kDType, T::kHeadDim>
          <<<blocks, kTileDqConvertThreads, 0, stream>>>(args);
      err = cudaGetLastError();
      if (err != cudaSuccess) return BackwardSm90LaunchError("dQ conversion launch", err);
    }
    return KernelStatus::Ok();
  }
}

// The dK/dV kernel (bwd_sm90_kernel.cuh at 64 / 128, bwd_sm90_wide_kernel.cuh at 192 / 256)
// with dQ by tile (kFusedDq) or without dQ, and what completes dQ after it.
template <DType kDType, int kHeadDim, bool kFusedDq>
KernelStatus LaunchBackwardSm90Variant(const BwdKernelArgs& args, const BwdGrid& grid,
                                       cudaStream_t stream) {
  if constexpr (kHeadDim > 128) {
    return LaunchBackwardSm90With<BwdSm90WideTraits<kDType, kHeadDim, kFusedDq>, kDType>(
        &FlashBackwardDkDvSm90WideKernel<kDType, kHeadDim, kFusedDq>, args, grid, stream);
  } else {
    if constexpr (Sm90BackwardHasPersistent(kHeadDim)) {
      const bool uneven_blocks = (args.fwd.window_left == kUnboundedWindow) !=
                                 (args.fwd.window_right == kUnboundedWindow);
      if (Sm90BackwardRunsPersistent(kHeadDim, kFusedDq, uneven_blocks, grid.max_seqlen_k)) {
        return LaunchBackwardSm90With<BwdSm90Traits<kDType, kHeadDim, kFusedDq, true>, kDType>(
            &FlashBackwardDkDvSm90PersistentKernel<kDType, kHeadDim, kFusedDq>, args, grid,
            stream);
      }
    }
    return LaunchBackwardSm90With<BwdSm90Traits<kDType, kHeadDim, kFusedDq, false>, kDType>(
        &FlashBackwardDkDvSm90Kernel<kDType, kHeadDim, kFusedDq>, args, grid, stream);
  }
}

// dQ by tile where Backward passes a dQ workspace (the atomic mode below 256); the deterministic
// mode (no workspace) and head dim 256 run the dK/dV kernel without dQ and then the dQ kernel.
template <DType kDType, int kHeadDim>
KernelStatus LaunchBackwardSm90(const BwdKernelArgs& args, const BwdGrid& grid,
                                cudaStream_t stream) {
  if constexpr (!Sm90BackwardSeparateDq(kHeadDim)) {
    if (args.dq_accum != nullptr) {
      return LaunchBackwardSm90Variant<kDType, kHeadDim, true>(args, grid, stream);
    }
  }
  return LaunchBackwardSm90Variant<kDType, kHeadDim, false>(args, grid, stream);
}

}  // namespace attnserve::kernels::flash
