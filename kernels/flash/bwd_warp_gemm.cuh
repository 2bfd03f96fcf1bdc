// Warp-level mma.sync building blocks of the backward kernels. Each warp multiplies its own 16
// rows; operands come from padded shared-memory tiles (ldmatrix) or, for the probability and
// gradient tiles, from registers in the accumulator layout (the forward's P V trick).
#pragma once

#include <cstdint>

#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// ldmatrix row addresses of one lane, relative to a tile's first row (bytes).
struct FragOffsets {
  // A operand (16 rows x 16 k, row-major [m][k]): lanes 0-15 rows 0-15, 16-31 again at k 8.
  // B operand stored transposed ([k][n], ldmatrix.trans) uses the same pattern with rows = k.
  uint32_t a;
  // B operand stored as rows of n ([n][k]): lanes 0-7 n 0-7, 8-15 the same at k 8, 16-31 n 8-15.
  uint32_t b;

  template <int kRowBytes>
  __device__ __forceinline__ static FragOffsets For(int lane) {
    const int r8 = lane % 8;
    const int half = (lane / 8) % 2;
    const int upper = lane / 16;
    return {static_cast<uint32_t>((r8 + half * 8) * kRowBytes + upper * 16),
            static_cast<uint32_t>((r8 + upper * 8) * kRowBytes + half * 16)};
  }
};

// acc[nt] += A * B^T for a 16 x (kNTiles * 8) tile: A is 16 rows at `a` (a lane's A address),
// B is kNTiles * 8 rows at `b` (a lane's B address), both [row][k] with kKSteps * 16 k.
template <class Arch, typename Element, int kNTiles, int kKSteps, int kRowBytes>
__device__ __forceinline__ void WarpGemmABt(float (&acc)[kNTiles][4], uint32_t a, uint32_t b) {
  static_assert(kNTiles % 2 == 0, "pairs of 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t af[4];
    ptx::LoadMatrixX4(af, a + kk * 32);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t bf[4];
      ptx::LoadMatrixX4(bf, b + np * 16 * kRowBytes + kk * 32);
      ptx::Mma16816<Arch, Element>(acc[2 * np], af, bf[0], bf[1]);
      ptx::Mma16816<Arch, Element>(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// Packs a 16 x (kKTiles * 8) fp32 tile in accumulator layout into A fragments, one per 16 k.
template <typename Element, int kKTiles>
__device__ __forceinline__ void PackA(uint32_t (&a)[kKTiles / 2][4],
                                      const float (&x)[kKTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kKTiles / 2; ++kk) {
    a[kk][0] = ptx::PackPair<Element>(x[2 * kk][0], x[2 * kk][1]);
    a[kk][1] = ptx::PackPair<Element>(x[2 * kk][2], x[2 * kk][3]);
    a[kk][2] = ptx::PackPair<Element>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[kk][3] = ptx::PackPair<Element>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

// acc[dt] += A * B for a 16 x (kDTiles * 8) tile: A packed fragments (kKSteps * 16 k), B stored
// [k][n] (kKSteps * 16 rows of kDTiles * 8 columns) at `b` (a lane's A-pattern address), read
// with ldmatrix.trans.
template <class Arch, typename Element, int kKSteps, int kDTiles, int kRowBytes>
__device__ __forceinline__ void WarpGemmAB(float (&acc)[kDTiles][4],
                                           const uint32_t (&a)[kKSteps][4], uint32_t b) {
  static_assert(kDTiles % 2 == 0, "pairs of 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t bf[4];
      ptx::LoadMatrixX4Trans(bf, b + kk * 16 * kRowBytes + dp * 32);
      ptx::Mma16816<Arch, Element>(acc[2 * dp], a[kk], bf[0], bf[1]);
      ptx::Mma16816<Arch, Element>(acc[2 * dp + 1], a[kk], bf[2], bf[3]);
    }
  }
}

// acc[mt][nt] += A * B^T for a (kMTiles * 16) x (kNTiles * 8) tile: A rows at `a` (a lane's A
// address, rows kRowBytesA apart), B rows at `b` (a lane's B address, kRowBytesB apart), both
// [row][k] with kKSteps * 16 k. Every B fragment feeds kMTiles products.
template <class Arch, typename Element, int kMTiles, int kNTiles, int kKSteps, int kRowBytesA,
          int kRowBytesB>
__device__ __forceinline__ void WarpGemmABtM(float (&acc)[kMTiles][kNTiles][4], uint32_t a,
                                             uint32_t b) {
  static_assert(kNTiles % 2 == 0, "pairs of 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t af[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ptx::LoadMatrixX4(af[mt], a + mt * 16 * kRowBytesA + kk * 32);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t bf[4];
      ptx::LoadMatrixX4(bf, b + np * 16 * kRowBytesB + kk * 32);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::Mma16816<Arch, Element>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
        ptx::Mma16816<Arch, Element>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// acc[mt][nt] += A * B for a (kMTiles * 16) x (kNTiles * 8) tile: A [m][k] in shared memory at
// `a` (a lane's A address, rows kRowBytesA apart; kATrans: stored [k][m], `a` then a lane's
// transposed-A address), B stored [k][n] at `b` (a lane's A-pattern address, rows kRowBytesB
// apart) read with ldmatrix.trans; kKSteps * 16 k.
template <class Arch, typename Element, int kMTiles, int kNTiles, int kKSteps, int kRowBytesA,
          int kRowBytesB, bool kATrans>
__device__ __forceinline__ void WarpGemmSmemAB(float (&acc)[kMTiles][kNTiles][4], uint32_t a,
                                               uint32_t b) {
  static_assert(kNTiles % 2 == 0, "pairs of 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t af[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kATrans) {
        ptx::LoadMatrixX4Trans(af[mt], a + kk * 16 * kRowBytesA + mt * 32);
      } else {
        ptx::LoadMatrixX4(af[mt], a + mt * 16 * kRowBytesA + kk * 32);
      }
    }
#pragma unroll
    for (int dp = 0; dp < kNTiles / 2; ++dp) {
      uint32_t bf[4];
      ptx::LoadMatrixX4Trans(bf, b + kk * 16 * kRowBytesB + dp * 32);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::Mma16816<Arch, Element>(acc[mt][2 * dp], af[mt], bf[0], bf[1]);
        ptx::Mma16816<Arch, Element>(acc[mt][2 * dp + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// Rounds a warp's 16 x (kDTiles * 8) fp32 tile (times `scale`) to 16 bits into its 16 rows of a
// padded shared-memory tile at `smem` (the warp's first row).
template <typename Element, int kDTiles, int kRowBytes>
__device__ __forceinline__ void StoreAccumulator(uint32_t smem, const float (&acc)[kDTiles][4],
                                                 float scale, int lane) {
  const int group = lane / 4;
  const int quad_lane = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      ptx::StoreShared32(smem + (group + 8 * h) * kRowBytes + (dt * 8 + 2 * quad_lane) * 2,
                         ptx::PackPair<Element>(acc[dt][2 * h] * scale,
                                                acc[dt][2 * h + 1] * scale));
    }
  }
}

}  // namespace attnserve::kernels::flash
