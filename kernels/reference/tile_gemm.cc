#include "kernels/reference/tile_gemm.h"

#include <algorithm>

namespace attnserve::kernels::reference {
namespace {

// Depth of one pass over k: a kDepthBlock x kTileCols panel of B (and the matching A strip)
// stays in L1 while every row tile of C consumes it.
constexpr std::ptrdiff_t kDepthBlock = 256;

// One kTileRows x kTileCols tile of C += A * B over depth k. Fixed trip counts let the compiler
// unroll the tile into vector registers.
inline void MicroKernel(std::ptrdiff_t k, const float* a, std::ptrdiff_t a_row,
                        std::ptrdiff_t a_col, const float* b, std::ptrdiff_t ldb, float* c,
                        std::ptrdiff_t ldc) {
  float acc[kTileRows][kTileCols];
  for (int i = 0; i < kTileRows; ++i) {
    for (int j = 0; j < kTileCols; ++j) acc[i][j] = c[i * ldc + j];
  }
  for (std::ptrdiff_t p = 0; p < k; ++p) {
    const float* b_row = b + p * ldb;
    for (int i = 0; i < kTileRows; ++i) {
      const float a_ip = a[i * a_row + p * a_col];
      for (int j = 0; j < kTileCols; ++j) acc[i][j] += a_ip * b_row[j];
    }
  }
  for (int i = 0; i < kTileRows; ++i) {
    for (int j = 0; j < kTileCols; ++j) c[i * ldc + j] = acc[i][j];
  }
}

}  // namespace

void GemmAccumulate(std::ptrdiff_t m, std::ptrdiff_t n, std::ptrdiff_t k, StridedMatrix a,
                    const float* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc) {
  for (std::ptrdiff_t p0 = 0; p0 < k; p0 += kDepthBlock) {
    const std::ptrdiff_t depth = std::min(kDepthBlock, k - p0);
    for (std::ptrdiff_t j = 0; j < n; j += kTileCols) {
      for (std::ptrdiff_t i = 0; i < m; i += kTileRows) {
        MicroKernel(depth, a.data + i * a.row_stride + p0 * a.col_stride, a.row_stride,
                    a.col_stride, b + p0 * ldb + j, ldb, c + i * ldc + j, ldc);
      }
    }
  }
}

}  // namespace attnserve::kernels::reference
