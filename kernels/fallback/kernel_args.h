// What the fallback kernels get by value, and the host-side launcher each instantiation file
// provides. No CUDA types here: fallback_attention.cc is plain C++.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/gpu_extras.h"

namespace attnserve::kernels::fallback {

// Sequences are at most kMaxSeqLen long, so int32 row/key arithmetic with windows up to
// kUnboundedWindow never overflows, and kUnboundedWindow reaches past every key.
inline constexpr int kMaxSeqLen = 1 << 28;
inline constexpr int kUnboundedWindow = 1 << 29;

// How a kernel multiplies tiles. Every path keeps a warp's 16 x 8 fp32 result tiles in the same
// registers (mma.sync's accumulator layout), so masking, softmax and epilogues are shared.
enum class Path : int {
  kSimt = 0,       // fp32 CUDA-core FMAs (fp32 inputs everywhere; bf16 below sm80)
  kWmma = 1,       // fp16 wmma 16x16x16 (sm70+), results staged through shared memory
  kMma1688 = 2,    // fp16 mma.sync m16n8k8 + ldmatrix (sm75+)
  kMma16816 = 3,   // fp16/bf16 mma.sync m16n8k16 + ldmatrix + cp.async (sm80+)
};

const char* PathName(Path path);

struct FwdArgs {
  const void* q;    // [total_q, num_heads, head_dim]
  const void* k;    // [total_k, num_heads_k, head_dim]
  const void* v;    // [total_k, num_heads_k, head_dim]
  void* out;        // [total_q, num_heads, head_dim]
  float* lse;       // [num_heads, total_q]
  const int32_t* cu_seqlens_q;  // device, batch + 1
  const int32_t* cu_seqlens_k;  // device, batch + 1
  int64_t total_q;
  int64_t total_k;
  int num_heads;
  int head_group;   // num_heads / num_heads_k
  int head_dim;     // real head dim (<= the kernel's bucket)
  int64_t q_row_stride;   // num_heads * head_dim
  int64_t kv_row_stride;  // num_heads_k * head_dim
  bool vector_io;   // every row start is 16-byte aligned: 16-byte loads, paired stores
  // Query row i sees key j iff i + (len_k - len_q) - window_left <= j <=
  // i + (len_k - len_q) + window_right (causal: window_right = 0).
  int window_left;
  int window_right;
  // pre = q.k (or tanh(q.k * softcap_input_scale) with softcap); p = exp2(pre * exp2_scale -
  // max * exp2_scale); lse = max * lse_scale + log(sum).
  float exp2_scale;
  float lse_scale;
  float softcap_input_scale;
  bool softcap;
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
