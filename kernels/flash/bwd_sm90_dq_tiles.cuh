// The conversion kernel of the tile-laid-out dQ workspace (bwd_sm90_dq_tiles.h).
#pragma once

#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_sm90_dq_tiles.h"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

inline constexpr int kTileDqConvertThreads = 256;  // one per lane of the 8 warp pieces

// dq = dq_accum * grad_scale for one chunk per CTA: blockIdx.x the tile, .y the query head, .z
// the sequence. Rows past the sequence and columns past the head dim are not stored.
template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(kTileDqConvertThreads)
    FlashBackwardConvertTileDqKernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename ElementOf<kDType>::type;
  constexpr int kCols = kHeadDim / 2;
  constexpr int kTiles = kCols / 8;
  const FwdKernelArgs& f = args.fwd;
  const int b = blockIdx.z;
  const int head = blockIdx.y;
  const int row0 = blockIdx.x * kTileDqRows;
  const int q_begin = f.cu_seqlens_q[b];
  const int len_q = f.cu_seqlens_q[b + 1] - q_begin;
  if (row0 >= len_q) return;
  const int piece = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warpgroup = piece / 4;
  const int row = row0 + (piece % 4) * 16 + lane / 4;
  const float4* src = reinterpret_cast<const float4*>(
      args.dq_accum + TileDqChunkOffset(q_begin, b, row0, head, f.num_heads, kHeadDim) +
      piece * 16 * kCols);
  Element* dst = static_cast<Element*>(args.dq) + (int64_t{q_begin} + row) * f.q_row_stride +
                 int64_t{head} * f.head_dim;
  const float scale = args.grad_scale;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int col = warpgroup * kCols + t * 8 + 2 * (lane % 4);
    if (col >= f.head_dim) break;
    const float4 v = src[t * 32 + lane];
    if (row < len_q) {
      *reinterpret_cast<uint32_t*>(dst + col) = ptx::PackPair<Element>(v.x * scale, v.y * scale);
    }
    if (row + 8 < len_q) {
      *reinterpret_cast<uint32_t*>(dst + 8 * f.q_row_stride + col) =
          ptx::PackPair<Element>(v.z * scale, v.w * scale);
    }
  }
}

}  // namespace attnserve::kernels::flash
