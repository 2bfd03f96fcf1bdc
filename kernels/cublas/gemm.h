// cuBLAS plumbing of the cublas family: the per-(device, thread) handle cache and one strided
// batched GEMM over the query heads of a chunk.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"

namespace attnserve::kernels::cublas {

// The calling thread's cuBLAS handle for the current device (created on first use, destroyed
// when the thread exits), bound to `stream` and to `workspace` (cublasSetWorkspace; must be
// 256-byte aligned). cublasSetStream resets the workspace, hence both on every call.
KernelStatus BindHandle(cudaStream_t stream, void* workspace, size_t workspace_bytes,
                        cublasHandle_t* handle);

// Drops the cached handles of `device` after a reset of its context (cudaDeviceReset), so
// the next calls there create fresh ones.
void ForgetHandles(int device);

cudaDataType_t CudaType(DType dtype);
// CUBLAS_COMPUTE_32F, pedantic (no TF32 or other reduced-precision paths) for fp32 inputs.
cublasComputeType_t ComputeType(DType dtype);

// A matrix per (kv head i, query head j of its group) of a chunk, column-major as cuBLAS sees
// it: element offset i * kv_stride + j * group_stride from `data`. group_stride 0: one matrix
// shared by the kv head's query heads (K, V, dK, dV).
struct HeadMatrix {
  const void* data;
  cudaDataType_t type;
  int64_t ld;
  int64_t kv_stride;
  int64_t group_stride;
};

struct GemmDims {
  bool trans_a;
  bool trans_b;
  int64_t m;
  int64_t n;
  int64_t k;
};

// C(i, j) = op(A(i, j)) op(B(i, j)) + beta C(i, j) for kv_heads x group head pairs, as strided
// batched GEMMs (fp32 compute, alpha 1). Batches run over kv heads with one launch per group
// head, or the other way round when that is fewer launches; a C shared by a group
// (group_stride 0) always takes the first form, so its updates run one after another in a fixed
// order.
KernelStatus GemmOverHeads(cublasHandle_t handle, cublasComputeType_t compute,
                           const GemmDims& dims, const HeadMatrix& a, const HeadMatrix& b,
                           const HeadMatrix& c, float beta, int kv_heads, int group);

}  // namespace attnserve::kernels::cublas
