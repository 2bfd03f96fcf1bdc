// The warpgroup MMA products over 128-byte-swizzled tiles (sm90_swizzled_tile.cuh) that the
// Hopper forward and the backward's dQ kernel share: a score product over the head dim (S = Q K^T,
// dP = dO V^T) and a product with register fragments (O += P V, dQ += dS K). Each is one
// committed wgmma group; the caller fences first.
#pragma once

#include <cstdint>

#include "kernels/flash/ptx_sm90.cuh"

namespace attnserve::kernels::flash {

// acc = A B^T over kSteps k16 steps of head dim: A the 64 rows at `a` (a warpgroup's rows of a
// kRowsA-row tile), B the kRowsB rows of the tile at `b`, both K-major.
template <class Mma, int kRowsA, int kRowsB, int kSteps, int kTiles>
__device__ __forceinline__ void IssueRowProducts(float (&acc)[kTiles][4], uint32_t a,
                                                 uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    // k16 step kk: head-dim block kk / 4, 32 bytes per step inside its 128-byte rows.
    const uint32_t step = (kk % 4) * 32;
    const uint64_t a_desc = ptx::MatrixDescriptor128B(a + (kk / 4) * kRowsA * 128 + step, 16, 1024);
    const uint64_t b_desc = ptx::MatrixDescriptor128B(b + (kk / 4) * kRowsB * 128 + step, 16, 1024);
    Mma::SS(acc, a_desc, b_desc, kk > 0);
  }
  ptx::WgmmaCommit();
}

// acc += P B: P as A fragments in registers, one per k16 step of B's rows; B the kRowsB-row tile
// at `b` as the N-major operand (64 head-dim columns per 128-byte row, rows 128 bytes apart,
// head-dim blocks kRowsB * 128 bytes apart).
template <class Mma, int kRowsB, int kSteps, int kTiles>
__device__ __forceinline__ void IssueFragmentProducts(float (&acc)[kTiles][4],
                                                      const uint32_t (&p)[kSteps][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    Mma::RS(acc, p[kk], ptx::MatrixDescriptor128B(b + kk * 16 * 128, kRowsB * 128, 1024), 1);
  }
  ptx::WgmmaCommit();
}

}  // namespace attnserve::kernels::flash
