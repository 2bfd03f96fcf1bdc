// What the fallback kernels get by value, and the host-side launcher each instantiation file
// provides. No CUDA types here: fallback_attention.cc is plain C++.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/gpu_attention_args.h"
#include "kernels/gpu_extras.h"

namespace attnserve::kernels::fallback {

// How a kernel multiplies tiles. Every path keeps a warp's 16 x 8 fp32 result tiles in the same
// registers (mma.sync's accumulator layout), so masking, softmax and epilogues are shared.
enum class Path : int {
  kSimt = 0,       // fp32 CUDA-core FMAs (fp32 inputs everywhere; bf16 below sm80)
  kWmma = 1,       // fp16 wmma 16x16x16 (sm70+), results staged through shared memory
  kMma1688 = 2,    // fp16 mma.sync m16n8k8 + ldmatrix (sm75+)
  kMma16816 = 3,   // fp16/bf16 mma.sync m16n8k16 + ldmatrix + cp.async (sm80+)
};

const char* PathName(Path path);

// The arguments every GPU family's forward gets (kernels/gpu_attention_args.h: kMaxSeqLen,
// kUnboundedWindow, the mask and scale rules), plus what only these kernels read.
struct FwdArgs : GpuAttentionArgs {
  int64_t total_k;
  bool vector_io;   // every row start is 16-byte aligned: 16-byte loads, paired stores
};

struct BwdArgs {
  FwdArgs fwd;      // out and lse of the forward (read only)
  const void* dout; // [total_q, num_heads, head_dim]
  void* dq;
  void* dk;
  void* dv;
  float* dsum;      // workspace: D = rowsum(dO * O), [num_heads, total_q]
  float grad_scale; // softmax_scale
};

struct LaunchShape {
  int batch;
  int max_seqlen_q;
  int max_seqlen_k;
  int smem_limit;   // the device's opt-in shared memory per block
};

// Defined per (dtype, head-dim bucket, extras) in the generated instantiation files; kExtras
// false ignores `extras` (the kernels without dropout and ALiBi).
template <DType kDtype, int kHeadDim, bool kExtras>
KernelStatus RunForward(const FwdArgs& args, const ExtrasArgs& extras, Path path,
                        const LaunchShape& shape, void* stream);
template <DType kDtype, int kHeadDim, bool kExtras>
KernelStatus RunBackward(const BwdArgs& args, const ExtrasArgs& extras, Path path,
                         const LaunchShape& shape, void* stream);

}  // namespace attnserve::kernels::fallback
