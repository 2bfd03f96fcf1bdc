// The backward's elementwise passes: first D = rowsum(dO * O) in float32 for every (query row,
// head), the term dS = P * (dP - D) needs (eight lanes per row, 16-byte loads); last, in
// non-deterministic mode, dq = softmax_scale * dQ_accum rounded to the element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

inline constexpr int kPreprocessThreads = 256;
inline constexpr int kPreprocessLanesPerRow = 8;
inline constexpr int kPreprocessRowsPerBlock = kPreprocessThreads / kPreprocessLanesPerRow;

__device__ __forceinline__ float2 ToFloat2(uint32_t bits, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
__device__ __forceinline__ float2 ToFloat2(uint32_t bits, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// Sum of the 8 products of two 16-byte vectors of 16-bit elements, in float32.
template <typename Element>
__device__ __forceinline__ float Dot8(const uint4& a, const uint4& b) {
  const uint32_t av[4] = {a.x, a.y, a.z, a.w};
  const uint32_t bv[4] = {b.x, b.y, b.z, b.w};
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = ToFloat2(av[i], Element{});
    const float2 y = ToFloat2(bv[i], Element{});
    sum = fmaf(x.x, y.x, fmaf(x.y, y.y, sum));
  }
  return sum;
}

// One (token, head) pair per 8 lanes; pair p's row starts at p * head_dim in out and dout
// ([total_q, num_heads, head_dim] is contiguous) and its D goes to dsum[head * total_q + token].
template <DType kDType>
__global__ void __launch_bounds__(kPreprocessThreads)
    FlashBackwardPreprocessKernel(const __grid_constant__ BwdKernelArgs args) {
  using Element = typename ElementOf<kDType>::type;
  constexpr int kVecElems = 16 / sizeof(Element);
  const FwdKernelArgs& f = args.fwd;
  const int64_t pairs = f.total_q * f.num_heads;
  const int64_t pair =
      int64_t{blockIdx.x} * kPreprocessRowsPerBlock + threadIdx.x / kPreprocessLanesPerRow;
  const int lane = threadIdx.x % kPreprocessLanesPerRow;
  float sum = 0.0f;
  if (pair < pairs) {
    const uint4* o = reinterpret_cast<const uint4*>(static_cast<const Element*>(f.out) +
                                                    pair * f.head_dim);
    const uint4* d = reinterpret_cast<const uint4*>(static_cast<const Element*>(args.dout) +
                                                    pair * f.head_dim);
    for (int vec = lane; vec < f.head_dim / kVecElems; vec += kPreprocessLanesPerRow) {
      sum += Dot8<Element>(o[vec], d[vec]);
    }
  }
#pragma unroll
  for (int step = kPreprocessLanesPerRow / 2; step > 0; step /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, step);
  }
  if (pair < pairs && lane == 0) {
    const int64_t token = pair / f.num_heads;
    const int head = static_cast<int>(pair % f.num_heads);
    args.dsum[head * f.total_q + token] = sum;
  }
}

inline constexpr int kConvertThreads = 256;

// dq[i] = dq_accum[i] * scale for `count` elements (a multiple of 8), 8 per thread.
template <DType kDType>
__device__ __forceinline__ void ConvertDq(const float* dq_accum, void* dq, int64_t count,
                                          float scale) {
  using Element = typename ElementOf<kDType>::type;
  const int64_t first = (int64_t{blockIdx.x} * kConvertThreads + threadIdx.x) * 8;
  if (first >= count) return;
  const float4 lo = *reinterpret_cast<const float4*>(dq_accum + first);
  const float4 hi = *reinterpret_cast<const float4*>(dq_accum + first + 4);
  uint4 packed;
  packed.x = ptx::PackPair<Element>(lo.x * scale, lo.y * scale);
  packed.y = ptx::PackPair<Element>(lo.z * scale, lo.w * scale);
  packed.z = ptx::PackPair<Element>(hi.x * scale, hi.y * scale);
  packed.w = ptx::PackPair<Element>(hi.z * scale, hi.w * scale);
  *reinterpret_cast<uint4*>(static_cast<Element*>(dq) + first) = packed;
}

template <DType kDType>
__global__ void __launch_bounds__(kConvertThreads)
    FlashBackwardConvertDqKernel(const float* dq_accum, void* dq, int64_t count, float scale) {
  if constexpr (kDType == DType::kBFloat16 && !kArchBodyCompiled<Sm80>) {
    __trap();  // bf16 runs on the sm80 path only: no bf16 conversion in an sm_75 binary
  } else {
    ConvertDq<kDType>(dq_accum, dq, count, scale);
  }
}

}  // namespace attnserve::kernels::flash
