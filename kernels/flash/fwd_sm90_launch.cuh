// Definition of LaunchForwardSm90, included by the generated sm90 instantiation files only.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/flash/fwd_launch.cuh"
#include "kernels/flash/fwd_sm90_kernel.cuh"

namespace attnserve::kernels::flash {

// The tensor maps of T's loads and stores (sm90_tensor_maps.h): q in boxes of a block's rows, k
// and v in boxes of a key tile's, out in boxes of a warp's 16 rows; none without keys (no tile
// is ever loaded or stored by TMA then).
template <class T>
KernelStatus MakeForwardSm90Maps(const FwdKernelArgs& args, const FwdGrid& grid,
                                 FwdSm90Maps<T::kTma, T::kTmaStore>& maps) {
  maps = {};
  if (grid.total_k == 0) return KernelStatus::Ok();
  if constexpr (T::kTma) {
    const int heads_k = args.num_heads / args.head_group;
    KernelStatus status = EncodeHeadBlockMap(&maps.loads.q, args.q, args.total_q, args.num_heads,
                                             args.head_dim, args.q_row_stride, T::kBlockM, "q");
    if (status.ok) {
      status = EncodeHeadBlockMap(&maps.loads.k, args.k, grid.total_k, heads_k, args.head_dim,
                                  args.kv_row_stride, T::kBlockN, "k");
    }
    if (status.ok) {
      status = EncodeHeadBlockMap(&maps.loads.v, args.v, grid.total_k, heads_k, args.head_dim,
                                  args.kv_row_stride, T::kBlockN, "v");
    }
    if (!status.ok) return status;
  }
  if constexpr (T::kTmaStore) {
    return EncodeHeadBlockMap(&maps.out, args.out, args.total_q, args.num_heads, args.head_dim,
                              args.q_row_stride, 16, "out");
  }
  return KernelStatus::Ok();
}

// Persistent (Sm90ForwardPersistent): one CTA per SM at most (the kernel's registers and shared
// memory allow one per SM), each running every gridDim.x-th query block.
template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardSm90Persistent(const FwdKernelArgs& args, const FwdGrid& grid,
                                         cudaStream_t stream) {
  using T = FwdSm90Traits<kDType, kHeadDim, true>;
  const auto kernel = &FlashForwardSm90PersistentKernel<kDType, kHeadDim>;
  if (KernelStatus status = AllowForwardSmem(kernel, T::kSmemBytes); !status.ok) return status;
  const int m_blocks = (grid.max_seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const int64_t blocks = int64_t{m_blocks} * args.num_heads * grid.batch;
  if (blocks > INT_MAX) {
    return KernelStatus::Error("flash: sm90 forward: " + std::to_string(blocks) +
                               " query blocks (heads x sequences x max_seqlen_q / " +
                               std::to_string(T::kBlockM) + ") exceed " +
                               std::to_string(INT_MAX));
  }
  if (blocks == 0) return KernelStatus::Ok();
  FwdSm90Maps<T::kTma, T::kTmaStore> maps;
  if (KernelStatus status = MakeForwardSm90Maps<T>(args, grid, maps); !status.ok) return status;
  const int ctas = static_cast<int>(std::min<int64_t>(blocks, std::max(grid.multiprocessors, 1)));
  kernel<<<ctas, T::kThreads, T::kSmemBytes, stream>>>(
      args, FwdSm90Grid{m_blocks, static_cast<int>(blocks)}, maps);
  return ForwardLaunchStatus("sm90 persistent forward");
}

template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardSm90(const FwdKernelArgs& args, const FwdGrid& grid,
                               cudaStream_t stream) {
  if (Sm90ForwardPersistent(kHeadDim, grid.max_seqlen_k)) {
    return LaunchForwardSm90Persistent<kDType, kHeadDim>(args, grid, stream);
  }
  using T = FwdSm90Traits<kDType, kHeadDim, false>;
  FwdSm90Maps<T::kTma, T::kTmaStore> maps;
  if (KernelStatus status = MakeForwardSm90Maps<T>(args, grid, maps); !status.ok) return status;
  return LaunchForwardGrid(&FlashForwardSm90Kernel<kDType, kHeadDim>, args, grid, T::kBlockM,
                           T::kThreads, T::kSmemBytes, stream, "sm90 forward", maps);
}

}  // namespace attnserve::kernels::flash
