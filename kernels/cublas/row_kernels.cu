#include "kernels/cublas/row_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/dropout_mask.h"
#include "kernels/device_convert.cuh"

namespace attnserve::kernels::cublas {
namespace {

// One CTA per (row, head) of a chunk; rows are short enough (keys of one sequence) that a CTA
// streams them three times from L2 rather than keeping them in shared memory.
constexpr int kRowThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarps = kRowThreads / kWarpSize;
// Elementwise kernels: threads per block and a cap on blocks (they loop over the rest).
constexpr int kFillThreads = 256;
constexpr int64_t kMaxFillBlocks = 4096;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Reduction over the CTA in a fixed order (warp butterflies, then warp 0 over the warp results),
// so the result is bitwise reproducible. Every thread gets the result.
template <typename Op>
__device__ float BlockReduce(float value, Op op, float* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();  // `shared` may still be read from the previous reduction
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < kWarps; ++w) total = op(total, shared[w]);
  return total;
}

// Keys [first, last] (columns of the chunk) that row r sees; empty when first > last.
struct Columns {
  int first;
  int last;
};

__device__ Columns VisibleColumns(const RowChunk& c, int r) {
  const int64_t diagonal = c.row_begin + r + c.len_k - c.len_q;
  int64_t first = 0;
  int64_t last = c.len_k - 1;
  if (c.window_left >= 0) first = max(first, diagonal - c.window_left);
  if (c.window_right >= 0) last = min(last, diagonal + c.window_right);
  // Clamped to [0, width] and [-1, width - 1] so both fit an int.
  first = min(max(first - c.key_begin, int64_t{0}), int64_t{c.width});
  last = max(min(last - c.key_begin, int64_t{c.width} - 1), int64_t{-1});
  return {static_cast<int>(first), static_cast<int>(last)};
}

// The ALiBi slope of a chunk head (0 when off), and its bias at column j of row r:
// -slope * |i + len_k - len_q - key| with i and key the row's and column's place in the sequence.
__device__ __forceinline__ float Slope(const RowChunk& c, int head) {
  return c.alibi == nullptr ? 0.0f : c.alibi[c.head_begin + head];
}

__device__ __forceinline__ float AlibiBias(const RowChunk& c, float slope, int r, int j) {
  const int64_t distance = c.row_begin + r + c.len_k - c.len_q - (c.key_begin + j);
  return -slope * static_cast<float>(distance < 0 ? -distance : distance);
}

__device__ __forceinline__ float Score(const RowChunk& c, float dot) {
  const float s = c.scale * dot;
  return c.softcap > 0.0f ? c.softcap * tanhf(s / c.softcap) : s;
}

// The score at column j of row r (of chunk head `head`, whose slope is `slope`).
__device__ __forceinline__ float ScoreAt(const RowChunk& c, float slope, int r, int j,
                                         float dot) {
  const float s = Score(c, dot);
  return slope == 0.0f ? s : s + AlibiBias(c, slope, r, j);
}

// The dropout factor of column j of row r: 1 without dropout, else 0 for a dropped entry and
// 1 / (1 - p) for a kept one (kernels/dropout_mask.h's contract).
__device__ __forceinline__ float DropoutFactor(const RowChunk& c, int head, int r, int j) {
  if (!c.dropout) return 1.0f;
  const uint32_t column = static_cast<uint32_t>(c.key_begin + j);
  const Philox4 bits = DropoutBits(c.dropout_seed, static_cast<uint32_t>(c.sequence),
                                   static_cast<uint32_t>(c.head_begin + head),
                                   static_cast<uint32_t>(c.row_begin + r), column);
  return DropoutKeep(bits.v[column % 4], c.dropout_threshold) ? c.dropout_scale : 0.0f;
}

// d(score) / d(q.k): scale, times (1 - tanh^2) under softcap.
__device__ __forceinline__ float ScoreAndDerivative(const RowChunk& c, float dot,
                                                    float* derivative) {
  const float s = c.scale * dot;
  if (c.softcap <= 0.0f) {
    *derivative = c.scale;
    return s;
  }
  const float t = tanhf(s / c.softcap);
  *derivative = c.scale * (1.0f - t * t);
  return c.softcap * t;
}

__device__ __forceinline__ size_t RowOffset(const RowChunk& c, int head, int r) {
  return (static_cast<size_t>(head) * c.rows + r) * static_cast<size_t>(c.ld);
}

// grid (rows, heads). `probs` may alias `scores` (fp32): each element is read and then written
// by the same thread, after the reductions.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    ForwardSoftmaxKernel(RowChunk c, const float* scores, T* probs, float* lse) {
  __shared__ float shared[kWarps];
  const int r = blockIdx.x;
  const int head = blockIdx.y;
  const float* s = scores + RowOffset(c, head, r);
  T* p = probs + RowOffset(c, head, r);
  const Columns cols = VisibleColumns(c, r);
  const int64_t lse_index = static_cast<int64_t>(c.head_begin + head) * c.total_q +
                            c.token_begin + r;
  if (cols.first > cols.last) {
    for (int j = threadIdx.x; j < c.width; j += kRowThreads) p[j] = FromFloat<T>(0.0f);
    if (threadIdx.x == 0) lse[lse_index] = INFINITY;
    return;
  }
  const float slope = Slope(c, head);
  float row_max = -INFINITY;
  for (int j = cols.first + threadIdx.x; j <= cols.last; j += kRowThreads) {
    row_max = fmaxf(row_max, ScoreAt(c, slope, r, j, s[j]));
  }
  row_max = BlockReduce(row_max, MaxOp(), shared);
  float sum = 0.0f;
  for (int j = cols.first + threadIdx.x; j <= cols.last; j += kRowThreads) {
    sum += expf(ScoreAt(c, slope, r, j, s[j]) - row_max);
  }
  sum = BlockReduce(sum, SumOp(), shared);
  const float row_lse = row_max + logf(sum);
  for (int j = threadIdx.x; j < c.width; j += kRowThreads) {
    const bool visible = j >= cols.first && j <= cols.last;
    p[j] = FromFloat<T>(visible ? expf(ScoreAt(c, slope, r, j, s[j]) - row_lse) *
                                      DropoutFactor(c, head, r, j)
                                : 0.0f);
  }
  if (threadIdx.x == 0) lse[lse_index] = row_lse;
}

// grid (rows, heads). probs/dscores may alias scores/dprobs (fp32), as in the forward.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    BackwardScoresKernel(RowChunk c, const float* scores, const float* dprobs, T* probs,
                         T* dscores, const float* lse) {
  __shared__ float shared[kWarps];
  const int r = blockIdx.x;
  const int head = blockIdx.y;
  const size_t offset = RowOffset(c, head, r);
  const Columns cols = VisibleColumns(c, r);
  const int64_t token = c.token_begin + r;
  const float row_lse = lse[static_cast<int64_t>(c.head_begin + head) * c.total_q + token];
  T* p = probs + offset;
  T* ds = dscores + offset;
  if (cols.first > cols.last || !(row_lse < INFINITY)) {
    for (int j = threadIdx.x; j < c.width; j += kRowThreads) {
      p[j] = FromFloat<T>(0.0f);
      ds[j] = FromFloat<T>(0.0f);
    }
    return;
  }
  // D = rowsum(dO * O) = sum_j P_j dP_j (O = sum_j P_j v_j, dP_j = dO . v_j), taken from the
  // fp32 P and dP rather than from the caller's out, which is rounded to the input dtype: that
  // rounding error is common to every dS of the row and survives the cancellation in
  // sum_j dS_j k_j (with out, dq of a head_dim-1 bf16 problem had 4.6x PyTorch's error), and
  // sum_j dS_j = 0 then holds to fp32 precision.
  // With dropout, dP of the undropped P is Z * dP * scale (the same factor as the forward's),
  // and D = rowsum(dO * O) = sum_j P_j (Z_j dP_j scale).
  const float* s = scores + offset;
  const float* dp = dprobs + offset;
  const float slope = Slope(c, head);
  float delta = 0.0f;
  for (int j = cols.first + threadIdx.x; j <= cols.last; j += kRowThreads) {
    delta += expf(ScoreAt(c, slope, r, j, s[j]) - row_lse) * dp[j] * DropoutFactor(c, head, r, j);
  }
  delta = BlockReduce(delta, SumOp(), shared);
  for (int j = threadIdx.x; j < c.width; j += kRowThreads) {
    float prob = 0.0f;
    float dscore = 0.0f;
    if (j >= cols.first && j <= cols.last) {
      float derivative;
      const float score = ScoreAndDerivative(c, s[j], &derivative);
      prob = expf((slope == 0.0f ? score : score + AlibiBias(c, slope, r, j)) - row_lse);
      const float factor = DropoutFactor(c, head, r, j);
      dscore = prob * (dp[j] * factor - delta) * derivative;
      prob *= factor;  // dV = (Z * P * scale)^T dO
    }
    p[j] = FromFloat<T>(prob);
    ds[j] = FromFloat<T>(dscore);
  }
}

template <typename T>
__global__ void ZeroRowsKernel(T* tensor, int64_t first_token, int64_t rows, int num_heads,
                               int head_begin, int heads, int head_dim, float* lse,
                               int64_t total_q) {
  const int64_t count = rows * heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % head_dim;
    const int64_t head = (i / head_dim) % heads;
    const int64_t row = i / (int64_t{head_dim} * heads);
    tensor[((first_token + row) * num_heads + head_begin + head) * head_dim + d] =
        FromFloat<T>(0.0f);
    if (lse != nullptr && d == 0) lse[(head_begin + head) * total_q + first_token + row] = INFINITY;
  }
}

template <typename T>
__global__ void StoreAccumulatorKernel(const float* accum, T* tensor, int64_t first_key,
                                       int64_t keys, int num_heads_k, int head_begin, int heads,
                                       int head_dim) {
  const int64_t count = keys * heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % head_dim;
    const int64_t key = (i / head_dim) % keys;
    const int64_t head = i / (int64_t{head_dim} * keys);
    tensor[((first_key + key) * num_heads_k + head_begin + head) * head_dim + d] =
        FromFloat<T>(accum[i]);
  }
}

KernelStatus LaunchStatus(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return KernelStatus::Ok();
  return KernelStatus::Error(std::string("cublas: launching ") + kernel + " failed: " +
                             cudaGetErrorString(err));
}

dim3 FillGrid(int64_t count) {
  return dim3(static_cast<unsigned>(
      std::max<int64_t>(1, std::min(kMaxFillBlocks, (count + kFillThreads - 1) / kFillThreads))));
}

// Calls fn(T{}) with T the element type of dtype.
template <typename Fn>
void WithElementType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16:
      fn(__half{});
      break;
    case DType::kBFloat16:
      fn(__nv_bfloat16{});
      break;
    case DType::kFloat32:
      fn(float{});
      break;
  }
}

}  // namespace

KernelStatus LaunchForwardSoftmax(DType dtype, const RowChunk& chunk, const float* scores,
                                  void* probs, float* lse, cudaStream_t stream) {
  const dim3 grid(chunk.rows, chunk.heads);
  WithElementType(dtype, [&](auto zero) {
    using T = decltype(zero);
    ForwardSoftmaxKernel<T><<<grid, kRowThreads, 0, stream>>>(chunk, scores,
                                                              static_cast<T*>(probs), lse);
  });
  return LaunchStatus("the softmax kernel");
}

KernelStatus LaunchBackwardScores(DType dtype, const RowChunk& chunk, const float* scores,
                                  const float* dprobs, void* probs, void* dscores,
                                  const float* lse, cudaStream_t stream) {
  const dim3 grid(chunk.rows, chunk.heads);
  WithElementType(dtype, [&](auto zero) {
    using T = decltype(zero);
    BackwardScoresKernel<T><<<grid, kRowThreads, 0, stream>>>(
        chunk, scores, dprobs, static_cast<T*>(probs), static_cast<T*>(dscores), lse);
  });
  return LaunchStatus("the dS kernel");
}

KernelStatus LaunchZeroRows(DType dtype, void* tensor, int64_t first_token, int64_t rows,
                            int num_heads, int head_begin, int heads, int head_dim, float* lse,
                            int64_t total_q, cudaStream_t stream) {
  const int64_t count = rows * heads * head_dim;
  if (count == 0) return KernelStatus::Ok();
  WithElementType(dtype, [&](auto zero) {
    using T = decltype(zero);
    ZeroRowsKernel<T><<<FillGrid(count), kFillThreads, 0, stream>>>(
        static_cast<T*>(tensor), first_token, rows, num_heads, head_begin, heads, head_dim, lse,
        total_q);
  });
  return LaunchStatus("the zero-rows kernel");
}

KernelStatus LaunchStoreAccumulator(DType dtype, const float* accum, void* tensor,
                                    int64_t first_key, int64_t keys, int num_heads_k,
                                    int head_begin, int heads, int head_dim,
                                    cudaStream_t stream) {
  const int64_t count = keys * heads * head_dim;
  if (count == 0) return KernelStatus::Ok();
  WithElementType(dtype, [&](auto zero) {
    using T = decltype(zero);
    StoreAccumulatorKernel<T><<<FillGrid(count), kFillThreads, 0, stream>>>(
        accum, static_cast<T*>(tensor), first_key, keys, num_heads_k, head_begin, heads,
        head_dim);
  });
  return LaunchStatus("the accumulator store kernel");
}

}  // namespace attnserve::kernels::cublas
