// The code paths of the flash kernels as template tags. Each kernel, its traits and its launcher
// take one, so one source builds both paths; the dispatcher picks the path from the effective
// compute capability (ExecutionContext.compute_capability, else the device's own).
//   Sm80: mma.sync m16n8k16 (fp16 and bf16), cp.async, up to 227 KB of shared memory per block.
//   Sm90 (Hopper, sm_90a): kernels of their own (fwd_sm90_kernel.cuh, and the backward dK/dV
//   kernel bwd_sm90_kernel.cuh: wgmma, two warpgroups per CTA); the tag names the path for
//   the dispatcher.
//   Sm75 (Turing): mma.sync m16n8k8 only (fp16), no cp.async (tiles go through registers with
//   16-byte loads and st.shared), 64 KB of shared memory per block.
// Plain C++ (no CUDA): the host dispatcher reads the same constants.
#pragma once

namespace attnserve::kernels::flash {

struct Sm80 {
  static constexpr int kComputeCapability = 80;  // lowest compute capability that runs the path
  static constexpr bool kMmaK16 = true;     // m16n8k16 (else each is two m16n8k8)
  static constexpr bool kAsyncCopy = true;  // cp.async (else register-staged, synchronous)
  static constexpr bool kBFloat16 = true;   // bf16 mma
  static constexpr const char* kName = "sm80";
};

struct Sm90 {
  static constexpr int kComputeCapability = 90;
  static constexpr const char* kName = "sm90";
};

struct Sm75 {
  static constexpr int kComputeCapability = 75;
  static constexpr bool kMmaK16 = false;
  static constexpr bool kAsyncCopy = false;
  static constexpr bool kBFloat16 = false;
  static constexpr const char* kName = "sm75";
  static constexpr int kMaxHeadDim = 64;        // FlashAttention 1's Turing limit
  static constexpr int kSmemPerBlock = 64 * 1024;  // Turing's opt-in maximum
};

// __CUDA_ARCH__ of the device pass being compiled; 0 in the host pass (and in .cc files).
#ifdef __CUDA_ARCH__
inline constexpr int kCompiledCudaArch = __CUDA_ARCH__;
#else
inline constexpr int kCompiledCudaArch = 0;
#endif

// Whether this pass compiles Arch's kernel bodies: every pass at or above the path's own
// architecture. Below it (the sm80 kernels in an sm_75 binary) a kernel body is a trap: the
// instructions do not exist there, and the dispatcher never launches it on such a device.
template <class Arch>
inline constexpr bool kArchBodyCompiled =
    kCompiledCudaArch == 0 || kCompiledCudaArch >= Arch::kComputeCapability * 10;

}  // namespace attnserve::kernels::flash
