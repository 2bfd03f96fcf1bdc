// RunForward / RunBackward for one (dtype, head-dim bucket): the code path's kernel
// configuration, the shared-memory opt-in, the grid and the launch check. Included once per
// generated instantiation file.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

#include "kernels/fallback/bwd_kernels.cuh"
#include "kernels/fallback/fwd_kernel.cuh"
#include "kernels/fallback/kernel_args.h"
#include "kernels/fallback/tile_config.cuh"

namespace attnserve::kernels::fallback {
namespace detail {

template <DType kDtype>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat16> { using type = __half; };
template <>
struct ElementOf<DType::kBFloat16> { using type = __nv_bfloat16; };
template <>
struct ElementOf<DType::kFloat32> { using type = float; };

// Which paths exist for an element type (the host picks one by compute capability).
template <typename T, Path P>
inline constexpr bool kPathExists =
    std::is_same_v<T, __half> ? P != Path::kSimt
    : std::is_same_v<T, __nv_bfloat16> ? (P == Path::kMma16816 || P == Path::kSimt)
                                       : P == Path::kSimt;

// (DTypeName lives in attn_kernels, which links this library, not the other way round.)
inline const char* ElementName(DType dtype) {
  return dtype == DType::kFloat16 ? "fp16" : dtype == DType::kBFloat16 ? "bf16" : "fp32";
}

inline KernelStatus Error(const std::string& message) {
  return KernelStatus::Error("fallback: " + message);
}

template <typename Kernel>
KernelStatus PrepareKernel(Kernel kernel, int smem, const LaunchShape& shape, const char* what) {
  if (smem > shape.smem_limit) {
    return Error(std::string(what) + " needs " + std::to_string(smem) +
                 " bytes of shared memory per block, the device allows " +
                 std::to_string(shape.smem_limit));
  }
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) {
    return Error(std::string("cudaFuncSetAttribute(") + what + ") failed: " +
                 cudaGetErrorString(err));
  }
  return KernelStatus::Ok();
}

inline KernelStatus CheckLaunch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return Error(std::string(what) + " launch failed: " + cudaGetErrorString(err));
  }
  return KernelStatus::Ok();
}

inline int CeilDiv(int a, int b) { return (a + b - 1) / b; }

template <Path P, typename T, int kHeadDim, bool kExtras>
KernelStatus LaunchForward(const FwdArgs& args, const ExtrasArgs& extras, const LaunchShape& shape,
                           cudaStream_t stream) {
  using Cfg = FwdConfig<P, T, kHeadDim>;
  auto kernel = FallbackForwardKernel<Cfg, kExtras>;
  KernelStatus status = PrepareKernel(kernel, Cfg::kSmemBytes, shape, "forward");
  if (!status.ok) return status;
  const dim3 grid(CeilDiv(shape.max_seqlen_q, Cfg::kBlockM), args.num_heads, shape.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args, extras);
  return CheckLaunch("forward");
}

template <Path P, typename T, int kHeadDim, bool kExtras>
KernelStatus LaunchBackward(const BwdArgs& args, const ExtrasArgs& extras,
                            const LaunchShape& shape, cudaStream_t stream) {
  using DkDv = BwdConfig<P, T, kHeadDim>;
  using Dq = FwdConfig<P, T, kHeadDim, /*kDq=*/true>;
  const FwdArgs& f = args.fwd;
  if (f.total_q > 0) {
    constexpr int kThreads = 256;
    const int64_t warps = f.total_q * f.num_heads;
    const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffff) return Error("total_q * num_heads is too large");
    FallbackDsumKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
    KernelStatus status = CheckLaunch("backward preprocess");
    if (!status.ok) return status;
  }
  if (f.total_k > 0) {
    auto kernel = FallbackDkDvKernel<DkDv, kExtras>;
    KernelStatus status = PrepareKernel(kernel, DkDv::kSmemBytes, shape, "backward dK/dV");
    if (!status.ok) return status;
    const dim3 grid(CeilDiv(shape.max_seqlen_k, DkDv::kBlockN), f.num_heads / f.head_group,
                    shape.batch);
    kernel<<<grid, DkDv::kThreads, DkDv::kSmemBytes, stream>>>(args, extras);
    status = CheckLaunch("backward dK/dV");
    if (!status.ok) return status;
  }
  if (f.total_q > 0) {
    auto kernel = FallbackDqKernel<Dq, kExtras>;
    KernelStatus status = PrepareKernel(kernel, Dq::kSmemBytes, shape, "backward dQ");
    if (!status.ok) return status;
    const dim3 grid(CeilDiv(shape.max_seqlen_q, Dq::kBlockM), f.num_heads, shape.batch);
    kernel<<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(args, extras);
    return CheckLaunch("backward dQ");
  }
  return KernelStatus::Ok();
}

}  // namespace detail

template <DType kDtype, int kHeadDim, bool kExtras>
KernelStatus RunForward(const FwdArgs& args, const ExtrasArgs& extras, Path path,
                        const LaunchShape& shape, void* stream) {
  using T = typename detail::ElementOf<kDtype>::type;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (path) {
    case Path::kMma16816:
      if constexpr (detail::kPathExists<T, Path::kMma16816>) {
        return detail::LaunchForward<Path::kMma16816, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
    case Path::kMma1688:
      if constexpr (detail::kPathExists<T, Path::kMma1688>) {
        return detail::LaunchForward<Path::kMma1688, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
    case Path::kWmma:
      if constexpr (detail::kPathExists<T, Path::kWmma>) {
        return detail::LaunchForward<Path::kWmma, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
    case Path::kSimt:
      if constexpr (detail::kPathExists<T, Path::kSimt>) {
        return detail::LaunchForward<Path::kSimt, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
  }
  return detail::Error(std::string("no ") + PathName(path) + " path for " +
                       detail::ElementName(kDtype));
}

template <DType kDtype, int kHeadDim, bool kExtras>
KernelStatus RunBackward(const BwdArgs& args, const ExtrasArgs& extras, Path path,
                         const LaunchShape& shape, void* stream) {
  using T = typename detail::ElementOf<kDtype>::type;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (path) {
    case Path::kMma16816:
      if constexpr (detail::kPathExists<T, Path::kMma16816>) {
        return detail::LaunchBackward<Path::kMma16816, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
    case Path::kMma1688:
      if constexpr (detail::kPathExists<T, Path::kMma1688>) {
        return detail::LaunchBackward<Path::kMma1688, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
    case Path::kWmma:
      if constexpr (detail::kPathExists<T, Path::kWmma>) {
        return detail::LaunchBackward<Path::kWmma, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
    case Path::kSimt:
      if constexpr (detail::kPathExists<T, Path::kSimt>) {
        return detail::LaunchBackward<Path::kSimt, T, kHeadDim, kExtras>(
            args, extras, shape, s);
      }
      break;
  }
  return detail::Error(std::string("no ") + PathName(path) + " path for " +
                       detail::ElementName(kDtype));
}

}  // namespace attnserve::kernels::fallback
