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
// the sequence. The warp pieces' accumulator order goes to row-major shared memory first, so
// that dq is written with whole 16-byte vectors along its rows (4-byte stores straight from the
// pieces made the conversion a tenth of a short backward's time). Rows past the sequence and
// columns past the head dim are not stored.
template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(kTileDqConvertThreads)
    FlashBackwardConvertTileDqKernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename ElementOf<kDType>::type;
  constexpr int kCols = kHeadDim / 2;
  constexpr int kTiles = kCols / 8;
  // Rows padded by 4 floats: the pieces' pairs then meet at most two to a bank.
  constexpr int kRowFloats = kHeadDim + 4;
  constexpr int kRowVecs = kHeadDim / 8;
  __shared__ __align__(16) float rows[kTileDqRows * kRowFloats];
  const FwdKernelArgs& f = args.fwd;
  const int b = blockIdx.z;
  const int head = blockIdx.y;
  const int row0 = blockIdx.x * kTileDqRows;
  const int q_begin = f.cu_seqlens_q[b];
  const int len_q = f.cu_seqlens_q[b + 1] - q_begin;
  if (row0 >= len_q) return;

  const int piece = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = (piece % 4) * 16 + lane / 4;
  const float4* src = reinterpret_cast<const float4*>(
      args.dq_accum + TileDqChunkOffset(q_begin, b, row0, head, f.num_heads, kHeadDim) +
      piece * 16 * kCols);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int col = TileDqColumn(kHeadDim, piece / 4, t) + 2 * (lane % 4);
    const float4 v = src[t * 32 + lane];
    *reinterpret_cast<float2*>(&rows[row * kRowFloats + col]) = make_float2(v.x, v.y);
    *reinterpret_cast<float2*>(&rows[(row + 8) * kRowFloats + col]) = make_float2(v.z, v.w);
  }
  __syncthreads();

  const float scale = args.grad_scale;
  const int rows_valid = min(kTileDqRows, len_q - row0);
  const int vecs_valid = f.head_dim / 8;
  Element* dst = static_cast<Element*>(args.dq) + (int64_t{q_begin} + row0) * f.q_row_stride +
                 int64_t{head} * f.head_dim;
  for (int i = threadIdx.x; i < kTileDqRows * kRowVecs; i += kTileDqConvertThreads) {
    const int r = i / kRowVecs;
    const int vec = i % kRowVecs;
    if (r >= rows_valid || vec >= vecs_valid) continue;
    const float4 lo = *reinterpret_cast<const float4*>(&rows[r * kRowFloats + vec * 8]);
    const float4 hi = *reinterpret_cast<const float4*>(&rows[r * kRowFloats + vec * 8 + 4]);
    uint4 packed;
    packed.x = ptx::PackPair<Element>(lo.x * scale, lo.y * scale);
    packed.y = ptx::PackPair<Element>(lo.z * scale, lo.w * scale);
    packed.z = ptx::PackPair<Element>(hi.x * scale, hi.y * scale);
    packed.w = ptx::PackPair<Element>(hi.z * scale, hi.w * scale);
    *reinterpret_cast<uint4*>(dst + int64_t{r} * f.q_row_stride + vec * 8) = packed;
  }
}

}  // namespace attnserve::kernels::flash
