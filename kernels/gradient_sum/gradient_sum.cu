#include "kernels/gradient_sum/gradient_sum.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/device_convert.cuh"

namespace attnserve::kernels::gradient_sum {
namespace {

// One element per thread, a grid-stride loop so any size fits a bounded grid.
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

template <typename T>
__global__ void AccumulateKernel(const T* __restrict__ partial, int64_t elements,
                                 float* __restrict__ accumulator) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    accumulator[i] += ToFloat(partial[i]);
  }
}

template <typename T>
__global__ void StoreKernel(const float* __restrict__ accumulator, int64_t elements,
                            T* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(accumulator[i]);
  }
}

unsigned Blocks(int64_t elements) {
  const int64_t blocks = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace

cudaError_t Accumulate(DType dtype, const void* partial, int64_t elements, float* accumulator,
                       cudaStream_t stream) {
  if (elements <= 0) return cudaSuccess;
  const unsigned blocks = Blocks(elements);
  switch (dtype) {
    case DType::kFloat32:
      AccumulateKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(partial),
                                                         elements, accumulator);
      break;
    case DType::kFloat16:
      AccumulateKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(partial),
                                                         elements, accumulator);
      break;
    case DType::kBFloat16:
      AccumulateKernel<<<blocks, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(partial), elements, accumulator);
      break;
  }
  return cudaGetLastError();
}

cudaError_t Store(DType dtype, const float* accumulator, int64_t elements, void* out,
                  cudaStream_t stream) {
  if (elements <= 0) return cudaSuccess;
  const unsigned blocks = Blocks(elements);
  switch (dtype) {
    case DType::kFloat32:
      StoreKernel<<<blocks, kThreads, 0, stream>>>(accumulator, elements,
                                                    static_cast<float*>(out));
      break;
    case DType::kFloat16:
      StoreKernel<<<blocks, kThreads, 0, stream>>>(accumulator, elements,
                                                    static_cast<__half*>(out));
      break;
    case DType::kBFloat16:
      StoreKernel<<<blocks, kThreads, 0, stream>>>(accumulator, elements,
                                                    static_cast<__nv_bfloat16*>(out));
      break;
  }
  return cudaGetLastError();
}

}  // namespace attnserve::kernels::gradient_sum
