// The one dense building block of the reference kernels: C += A * B on float scratch, blocked
// into a register tile small enough for the compiler to keep in vector registers.
#pragma once

#include <cstddef>

namespace attnserve::kernels::reference {

// Accumulator tile of the micro-kernel, chosen by measurement: with GCC 12 -O3 on baseline
// x86-64 (SSE2 only, so binaries run on any host), 4 x 32 reached ~30 GFLOP/s per core against
// ~8 for 4 x 8 and ~20 for 8 x 32; the wide row amortises each broadcast of A over 8 vectors.
constexpr int kTileRows = 4;
constexpr int kTileCols = 32;

// Operand A of GemmAccumulate: element (i, p) at data[i * row_stride + p * col_stride], so a
// row-major matrix and its transpose are both views of the same scratch.
struct StridedMatrix {
  const float* data;
  std::ptrdiff_t row_stride;
  std::ptrdiff_t col_stride;
};

// C[m x n] += A[m x k] * B[k x n]; B row p starts at b + p * ldb and C row i at c + i * ldc,
// both contiguous. Callers pad their scratch so m % kTileRows == 0 and n % kTileCols == 0.
void GemmAccumulate(std::ptrdiff_t m, std::ptrdiff_t n, std::ptrdiff_t k, StridedMatrix a,
                    const float* b, std::ptrdiff_t ldb, float* c, std::ptrdiff_t ldc);

}  // namespace attnserve::kernels::reference
