// Warp-level tile products for every path. One contract for all of them: a warp's 16 x 8 fp32
// result tile is float[4] per lane, lane 4g + t holding rows g and g + 8, columns 2t and 2t + 1
// (mma.sync's accumulator layout). So the kernels mask, softmax and store the same registers
// whatever multiplied them:
//   GemmNT: acc[16 x N] += A[16 x K] * B[N x K]^T, A and B rows in shared memory.
//   GemmNN: acc[16 x N] += A[16 x K] * B[K x N],   A in result-tile registers, B rows in smem.
// kMma16816 / kMma1688 use ldmatrix + mma.sync; kWmma stages through per-warp shared scratch
// (wmma's fragment layouts are opaque); kSimt does fp32 FMAs from shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "kernels/device_convert.cuh"
#include "kernels/fallback/kernel_args.h"

namespace attnserve::kernels::fallback {

#ifdef __CUDA_ARCH__
inline constexpr int kCompiledArch = __CUDA_ARCH__;
#else
inline constexpr int kCompiledArch = 0;
#endif

// Scratch floats per warp that kWmma / kSimt need for a k extent of up to kMaxK.
template <Path P>
__host__ __device__ constexpr int ScratchBytesPerWarp(int max_k) {
  if (P == Path::kSimt) return 16 * (max_k + 4) * 4;
  if (P == Path::kWmma) return 16 * (max_k + 8) * 2 + 16 * 20 * 4;
  return 0;
}

__device__ __forceinline__ int LaneId() { return threadIdx.x & 31; }

namespace ptx {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
#else
  __trap();
#endif
}

__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
#else
  __trap();
#endif
}

// d += a * b, 16x8x8 fp16 (sm75+).
__device__ __forceinline__ void Mma1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
#else
  __trap();
#endif
}

// d += a * b, 16x8x16 fp16 or bf16 (sm80+).
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();
#endif
}

// (lo, hi) rounded to two 16-bit values in one register, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// 2^x (relative error 2^-22; 2^-inf = 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16-byte global -> shared copy, zero-filled when !valid. cp.async on sm80+ (completes at
// WaitAsync), a register round trip before.
__device__ __forceinline__ void Copy16(void* smem, const void* gmem, bool valid, bool async) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (async) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)),
                 "l"(gmem), "r"(valid ? 16 : 0));
    return;
  }
#endif
  uint4 v = make_uint4(0, 0, 0, 0);
  if (valid) v = __ldg(static_cast<const uint4*>(gmem));
  *static_cast<uint4*>(smem) = v;
}

__device__ __forceinline__ void CommitAndWaitAll() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}

}  // namespace ptx

// Paths whose tile loads go through cp.async (their kernels only run on sm80+).
template <Path P>
inline constexpr bool kAsyncCopy = P == Path::kMma16816;

template <Path P, typename T, int kN, int kK>
__device__ __forceinline__ void GemmNT(float (&acc)[kN / 8][4], const T* a, int lda, const T* b,
                                       int ldb, float* scratch) {
  static_assert(kN % 8 == 0 && kK % 16 == 0, "tile extents");
  const int lane = LaneId();
  if constexpr (P == Path::kMma16816 || P == Path::kMma1688) {
    static_assert(kN % 16 == 0 && sizeof(T) == 2, "tensor-core tiles");
    const int i = lane / 8, r = lane % 8;
#pragma unroll
    for (int k = 0; k < kK; k += 16) {
      uint32_t af[4];
      ptx::LoadMatrixX4(af, a + ((i % 2) * 8 + r) * lda + k + (i / 2) * 8);
#pragma unroll
      for (int n = 0; n < kN; n += 16) {
        uint32_t bf[4];
        ptx::LoadMatrixX4(bf, b + (n + (i / 2) * 8 + r) * ldb + k + (i % 2) * 8);
        if constexpr (P == Path::kMma16816) {
          ptx::Mma16816<T>(acc[n / 8], af, bf[0], bf[1]);
          ptx::Mma16816<T>(acc[n / 8 + 1], af, bf[2], bf[3]);
        } else {
          ptx::Mma1688(acc[n / 8], af[0], af[1], bf[0]);
          ptx::Mma1688(acc[n / 8], af[2], af[3], bf[1]);
          ptx::Mma1688(acc[n / 8 + 1], af[0], af[1], bf[2]);
          ptx::Mma1688(acc[n / 8 + 1], af[2], af[3], bf[3]);
        }
      }
    }
  } else if constexpr (P == Path::kWmma) {
    static_assert(kN % 16 == 0 && std::is_same_v<T, __half>, "wmma tiles");
    using namespace nvcuda;
    const int g = lane / 4, t = lane % 4;
    constexpr int kLd = 20;  // scratch row stride (floats) of the 16 x 16 result
#pragma unroll
    for (int n = 0; n < kN; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.0f);
#pragma unroll
      for (int k = 0; k < kK; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, a + k, lda);
        wmma::load_matrix_sync(fb, b + n * ldb + k, ldb);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(scratch, c, kLd, wmma::mem_row_major);
      __syncwarp();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc[n / 8 + h][0] += scratch[g * kLd + h * 8 + 2 * t];
        acc[n / 8 + h][1] += scratch[g * kLd + h * 8 + 2 * t + 1];
        acc[n / 8 + h][2] += scratch[(g + 8) * kLd + h * 8 + 2 * t];
        acc[n / 8 + h][3] += scratch[(g + 8) * kLd + h * 8 + 2 * t + 1];
      }
      __syncwarp();
    }
  } else {
    const int g = lane / 4, t = lane % 4;
    const T* a0 = a + g * lda;
    const T* a1 = a + (g + 8) * lda;
#pragma unroll 4
    for (int k = 0; k < kK; ++k) {
      const float x0 = ToFloat(a0[k]);
      const float x1 = ToFloat(a1[k]);
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
        const float y0 = ToFloat(b[(n * 8 + 2 * t) * ldb + k]);
        const float y1 = ToFloat(b[(n * 8 + 2 * t + 1) * ldb + k]);
        acc[n][0] = fmaf(x0, y0, acc[n][0]);
        acc[n][1] = fmaf(x0, y1, acc[n][1]);
        acc[n][2] = fmaf(x1, y0, acc[n][2]);
        acc[n][3] = fmaf(x1, y1, acc[n][3]);
      }
    }
  }
}

template <Path P, typename T, int kN, int kK>
__device__ __forceinline__ void GemmNN(float (&acc)[kN / 8][4], const float (&a)[kK / 8][4],
                                       const T* b, int ldb, float* scratch) {
  static_assert(kN % 8 == 0 && kK % 8 == 0, "tile extents");
  const int lane = LaneId();
  if constexpr (P == Path::kMma16816 || P == Path::kMma1688) {
    static_assert(kN % 16 == 0 && kK % 16 == 0 && sizeof(T) == 2, "tensor-core tiles");
    const int i = lane / 8, r = lane % 8;
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      uint32_t af[4];
      af[0] = ptx::PackPair<T>(a[2 * kk][0], a[2 * kk][1]);
      af[1] = ptx::PackPair<T>(a[2 * kk][2], a[2 * kk][3]);
      af[2] = ptx::PackPair<T>(a[2 * kk + 1][0], a[2 * kk + 1][1]);
      af[3] = ptx::PackPair<T>(a[2 * kk + 1][2], a[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < kN; n += 16) {
        uint32_t bf[4];
        ptx::LoadMatrixX4Trans(bf, b + (kk * 16 + (i % 2) * 8 + r) * ldb + n + (i / 2) * 8);
        if constexpr (P == Path::kMma16816) {
          ptx::Mma16816<T>(acc[n / 8], af, bf[0], bf[1]);
          ptx::Mma16816<T>(acc[n / 8 + 1], af, bf[2], bf[3]);
        } else {
          ptx::Mma1688(acc[n / 8], af[0], af[1], bf[0]);
          ptx::Mma1688(acc[n / 8], af[2], af[3], bf[1]);
          ptx::Mma1688(acc[n / 8 + 1], af[0], af[1], bf[2]);
          ptx::Mma1688(acc[n / 8 + 1], af[2], af[3], bf[3]);
        }
      }
    }
  } else if constexpr (P == Path::kWmma) {
    static_assert(kN % 16 == 0 && kK % 16 == 0 && std::is_same_v<T, __half>, "wmma tiles");
    using namespace nvcuda;
    const int g = lane / 4, t = lane % 4;
    constexpr int kLdA = kK + 8;  // halves
    constexpr int kLd = 20;       // floats
    __half* sa = reinterpret_cast<__half*>(scratch);
    float* sc = scratch + 16 * kLdA / 2;
#pragma unroll
    for (int j = 0; j < kK / 8; ++j) {
      *reinterpret_cast<__half2*>(sa + g * kLdA + j * 8 + 2 * t) =
          __floats2half2_rn(a[j][0], a[j][1]);
      *reinterpret_cast<__half2*>(sa + (g + 8) * kLdA + j * 8 + 2 * t) =
          __floats2half2_rn(a[j][2], a[j][3]);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < kN; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.0f);
#pragma unroll
      for (int k = 0; k < kK; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, sa + k, kLdA);
        wmma::load_matrix_sync(fb, b + k * ldb + n, ldb);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(sc, c, kLd, wmma::mem_row_major);
      __syncwarp();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc[n / 8 + h][0] += sc[g * kLd + h * 8 + 2 * t];
        acc[n / 8 + h][1] += sc[g * kLd + h * 8 + 2 * t + 1];
        acc[n / 8 + h][2] += sc[(g + 8) * kLd + h * 8 + 2 * t];
        acc[n / 8 + h][3] += sc[(g + 8) * kLd + h * 8 + 2 * t + 1];
      }
      __syncwarp();
    }
  } else {
    const int g = lane / 4, t = lane % 4;
    constexpr int kLdA = kK + 4;
#pragma unroll
    for (int j = 0; j < kK / 8; ++j) {
      scratch[g * kLdA + j * 8 + 2 * t] = a[j][0];
      scratch[g * kLdA + j * 8 + 2 * t + 1] = a[j][1];
      scratch[(g + 8) * kLdA + j * 8 + 2 * t] = a[j][2];
      scratch[(g + 8) * kLdA + j * 8 + 2 * t + 1] = a[j][3];
    }
    __syncwarp();
#pragma unroll 4
    for (int k = 0; k < kK; ++k) {
      const float x0 = scratch[g * kLdA + k];
      const float x1 = scratch[(g + 8) * kLdA + k];
      const T* brow = b + k * ldb + 2 * t;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
        const float y0 = ToFloat(brow[n * 8]);
        const float y1 = ToFloat(brow[n * 8 + 1]);
        acc[n][0] = fmaf(x0, y0, acc[n][0]);
        acc[n][1] = fmaf(x0, y1, acc[n][1]);
        acc[n][2] = fmaf(x1, y0, acc[n][2]);
        acc[n][3] = fmaf(x1, y1, acc[n][3]);
      }
    }
    __syncwarp();
  }
}

}  // namespace attnserve::kernels::fallback
