// Global <-> shared tile movement for the fallback kernels. Tiles are rows of kDim elements
// (the head-dim bucket) at a padded shared-memory stride; rows past `valid_rows` and columns
// past the real head dim are zero-filled, so padding contributes nothing to any product.
#pragma once

#include <cstdint>

#include "kernels/fallback/warp_tile.cuh"

namespace attnserve::kernels::fallback {

// Loads kRows rows starting at gmem (row r at gmem + r * row_stride). With vector_io every
// row start is 16-byte aligned and head_dim a multiple of 16 bytes: 16-byte copies (cp.async on
// sm80+ paths, completing at ptx::CommitAndWaitAll); otherwise element by element.
template <typename T, int kRows, int kDim, int kStride, int kThreads, bool kAsync>
__device__ __forceinline__ void LoadTile(T* smem, const T* gmem, int64_t row_stride,
                                         int valid_rows, int head_dim, bool vector_io) {
  const int tid = threadIdx.x;
  if (vector_io) {
    constexpr int kVec = 16 / sizeof(T);
    constexpr int kChunksPerRow = kDim / kVec;
    constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll 4
    for (int c = tid; c < kChunks; c += kThreads) {
      const int row = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * kVec;
      const bool valid = row < valid_rows && col < head_dim;
      const T* src = valid ? gmem + row * row_stride + col : gmem;
      ptx::Copy16(smem + row * kStride + col, src, valid, kAsync);
    }
  } else {
    constexpr int kElems = kRows * kDim;
#pragma unroll 4
    for (int e = tid; e < kElems; e += kThreads) {
      const int row = e / kDim;
      const int col = e % kDim;
      T x = FromFloat<T>(0.0f);
      if (row < valid_rows && col < head_dim) x = gmem[row * row_stride + col];
      smem[row * kStride + col] = x;
    }
  }
}

// Register staging for paths without cp.async (sm70/sm75): Fetch issues a tile's 16-byte global
// loads into registers before the CTA computes on the previous tile, Store writes them to shared
// memory after it, so the loads' latency hides behind that work. Needs vector_io.
template <typename T, int kRows, int kDim, int kStride, int kThreads>
struct TileFetch {
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kChunksPerRow = kDim / kVec;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  uint4 regs[kPerThread];

  __device__ __forceinline__ void Fetch(const T* gmem, int64_t row_stride, int valid_rows,
                                        int head_dim) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int row = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * kVec;
      const bool valid = (kChunks % kThreads == 0 || c < kChunks) && row < valid_rows &&
                         col < head_dim;
      regs[i] = valid ? __ldg(reinterpret_cast<const uint4*>(gmem + row * row_stride + col))
                      : make_uint4(0, 0, 0, 0);
    }
  }

  __device__ __forceinline__ void Store(T* smem) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (kChunks % kThreads == 0 || c < kChunks) {
        *reinterpret_cast<uint4*>(smem + (c / kChunksPerRow) * kStride +
                                  (c % kChunksPerRow) * kVec) = regs[i];
      }
    }
  }
};

// Stores a warp's 16 x (8 * kTiles) result tiles (rows row0 and row0 + 8 of this lane, each
// valid when below `valid_rows`), times `scale`, into rows of gmem; columns from col0, those
// at or past head_dim skipped.
template <typename T, int kTiles>
__device__ __forceinline__ void StoreTile(T* gmem, int64_t row_stride,
                                          const float (&acc)[kTiles][4], int row0,
                                          int valid_rows, int col0, int head_dim, float scale,
                                          bool vector_io) {
  const int lane = LaneId();
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + half * 8;
    if (row >= valid_rows) continue;
    T* dst = gmem + row * row_stride;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const int col = col0 + n * 8 + 2 * t;
      const float x0 = acc[n][2 * half] * scale;
      const float x1 = acc[n][2 * half + 1] * scale;
      if (vector_io) {
        if (col < head_dim) {  // head_dim is even here: both columns are in
          if constexpr (sizeof(T) == 4) {
            *reinterpret_cast<float2*>(dst + col) = make_float2(x0, x1);
          } else {
            *reinterpret_cast<uint32_t*>(dst + col) = ptx::PackPair<T>(x0, x1);
          }
        }
      } else {
        if (col < head_dim) dst[col] = FromFloat<T>(x0);
        if (col + 1 < head_dim) dst[col + 1] = FromFloat<T>(x1);
      }
    }
  }
}

}  // namespace attnserve::kernels::fallback
