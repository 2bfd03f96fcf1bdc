// cuBLAS, opened at run time (dlopen) instead of linked. libcublasLt holds ~94 KB of
// thread-local storage; linked, it joins the static TLS block every thread of the process must
// fit in its stack, and libraries that start threads with small stacks then fail to start any
// (Debian's civetweb, our HTTP server, asks for 100 KB and gets EINVAL). Opened with dlopen, its
// TLS is allocated per thread on first use instead. It also lets a binary without cuBLAS on the
// machine run every other family, with this one reporting why it cannot.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace attnserve::kernels::cublas {

// The entry points the family uses, resolved from libcublas.so.<CUBLAS_VER_MAJOR>.
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasGetStatusString) status_string;
  cublasStatus_t (*gemm_strided_batched_ex)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
      const void*, cudaDataType, int, long long int, const void*, cudaDataType, int,
      long long int, const void*, void*, cudaDataType, int, long long int, int,
      cublasComputeType_t, cublasGemmAlgo_t);
};

// Opens the library on the first call (thread-safe) and keeps it for the process. nullptr, with
// the reason in *error (library or symbol not found), when it cannot.
const CublasApi* Cublas(std::string* error);

}  // namespace attnserve::kernels::cublas
