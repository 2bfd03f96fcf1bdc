#include "kernels/cublas/gemm.h"

#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cublas/cublas_loader.h"

namespace attnserve::kernels::cublas {
namespace {

// Only called once Cublas() has loaded the library.
KernelStatus CublasError(const char* what, cublasStatus_t status) {
  std::string unused;
  return KernelStatus::Error(std::string("cublas: ") + what + " failed: " +
                             Cublas(&unused)->status_string(status));
}

// One handle per (device, host thread), created on first use and kept for the life of the
// process (cuBLAS handles are cheap to keep, expensive to create, and destroying them at exit
// would race the CUDA runtime's own teardown). A process-wide table under a mutex rather than
// a thread_local: the static CUDA runtime already holds a 4 KB-aligned thread-local block, and
// any more thread-local data doubles every thread's static TLS to 8 KB, which makes
// pthread_create fail (EINVAL) for libraries that start threads with small stacks — Debian's
// civetweb, the HTTP server, among them.
class HandleTable {
 public:
  KernelStatus Get(int device, cublasHandle_t* handle) {
    const Key key{device, std::this_thread::get_id()};
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, h] : handles_) {
      if (k == key) {
        *handle = h;
        return KernelStatus::Ok();
      }
    }
    cublasHandle_t created = nullptr;
    std::string unused;
    const cublasStatus_t status = Cublas(&unused)->create(&created);
    if (status != CUBLAS_STATUS_SUCCESS) return CublasError("cublasCreate", status);
    handles_.emplace_back(key, created);
    *handle = created;
    return KernelStatus::Ok();
  }

  // Forgets `device`'s handles without destroying them: they belong to a context that a reset
  // destroyed (destroying them now could touch a newer context); each leaks a few KB.
  void Forget(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<Key, cublasHandle_t>> kept;
    for (const auto& entry : handles_) {
      if (entry.first.first != device) kept.push_back(entry);
    }
    handles_ = std::move(kept);
  }

 private:
  using Key = std::pair<int, std::thread::id>;
  std::mutex mu_;
  std::vector<std::pair<Key, cublasHandle_t>> handles_;
};

bool FitsInt(int64_t x) { return x >= 0 && x <= std::numeric_limits<int>::max(); }

size_t ElementBytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

const void* Advance(const void* data, cudaDataType_t type, int64_t elements) {
  return static_cast<const char*>(data) + elements * static_cast<int64_t>(ElementBytes(type));
}

HandleTable* Handles() {
  static HandleTable* const table = new HandleTable();  // never destroyed, see HandleTable
  return table;
}

}  // namespace

void ForgetHandles(int device) { Handles()->Forget(device); }

KernelStatus BindHandle(cudaStream_t stream, void* workspace, size_t workspace_bytes,
                        cublasHandle_t* handle) {
  HandleTable* const table = Handles();
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    return KernelStatus::Error(std::string("cublas: cudaGetDevice failed: ") +
                               cudaGetErrorString(err));
  }
  std::string load_error;
  const CublasApi* api = Cublas(&load_error);
  if (api == nullptr) return KernelStatus::Error("cublas: " + load_error);
  KernelStatus status = table->Get(device, handle);
  if (!status.ok) return status;
  cublasStatus_t s = api->set_stream(*handle, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasSetStream", s);
  s = api->set_workspace(*handle, workspace, workspace_bytes);
  if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasSetWorkspace", s);
  return KernelStatus::Ok();
}

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat32:
      break;
  }
  return CUDA_R_32F;
}

cublasComputeType_t ComputeType(DType dtype) {
  return dtype == DType::kFloat32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
}

KernelStatus GemmOverHeads(cublasHandle_t handle, cublasComputeType_t compute,
                           const GemmDims& dims, const HeadMatrix& a, const HeadMatrix& b,
                           const HeadMatrix& c, float beta, int kv_heads, int group) {
  if (!FitsInt(dims.m) || !FitsInt(dims.n) || !FitsInt(dims.k) || !FitsInt(a.ld) ||
      !FitsInt(b.ld) || !FitsInt(c.ld)) {
    return KernelStatus::Error("cublas: a GEMM dimension exceeds cuBLAS' int range");
  }
  if (dims.m == 0 || dims.n == 0 || dims.k == 0 || kv_heads == 0 || group == 0) {
    return KernelStatus::Error("cublas: internal error: empty GEMM");
  }
  // Outer loop over group heads (batches over kv heads) unless the other way round is fewer
  // launches and C is not shared within a group.
  const bool batch_over_kv = c.group_stride == 0 || group <= kv_heads;
  const int launches = batch_over_kv ? group : kv_heads;
  const int batch = batch_over_kv ? kv_heads : group;
  auto outer = [&](const HeadMatrix& x) { return batch_over_kv ? x.group_stride : x.kv_stride; };
  auto inner = [&](const HeadMatrix& x) { return batch_over_kv ? x.kv_stride : x.group_stride; };
  const float alpha = 1.0f;
  std::string unused;
  const CublasApi* api = Cublas(&unused);  // loaded: the caller bound a handle
  for (int i = 0; i < launches; ++i) {
    const cublasStatus_t status = api->gemm_strided_batched_ex(
        handle, dims.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, dims.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(dims.m), static_cast<int>(dims.n), static_cast<int>(dims.k), &alpha,
        Advance(a.data, a.type, i * outer(a)), a.type, static_cast<int>(a.ld), inner(a),
        Advance(b.data, b.type, i * outer(b)), b.type, static_cast<int>(b.ld), inner(b), &beta,
        const_cast<void*>(Advance(c.data, c.type, i * outer(c))), c.type,
        static_cast<int>(c.ld), inner(c), batch, compute, CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_SUCCESS) return CublasError("cublasGemmStridedBatchedEx", status);
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::cublas
