// What every GPU family's forward kernel gets by value (and its backward, as the forward it
// recomputes): device pointers, sizes, and the options normalized by the host (windows as
// signed offsets from the diagonal, scales folded for exp2). One layout for flash and fallback,
// filled by one function (MakeGpuAttentionArgs, gpu_launch_common.h), so that a masking or
// scaling rule lives in one place. No CUDA types: host code includes it too.
#pragma once

#include <cstdint>

namespace attnserve::kernels {

// Sequences are at most kMaxSeqLen long, so int32 row/key arithmetic with windows up to
// kUnboundedWindow never overflows, and a window of kUnboundedWindow reaches past every key.
inline constexpr int kMaxSeqLen = 1 << 28;
inline constexpr int kUnboundedWindow = 1 << 29;

struct GpuAttentionArgs {
  const void* q;    // [total_q, num_heads, head_dim]
  const void* k;    // [total_k, num_heads_k, head_dim]
  const void* v;    // [total_k, num_heads_k, head_dim]
  void* out;        // [total_q, num_heads, head_dim]
  float* lse;       // [num_heads, total_q]
  const int32_t* cu_seqlens_q;  // device, batch + 1
  const int32_t* cu_seqlens_k;  // device, batch + 1
  int64_t total_q;
  int num_heads;
  int head_group;   // num_heads / num_heads_k: query heads per kv head
  int head_dim;     // real head dim (<= the kernel's)
  int64_t q_row_stride;   // elements between consecutive tokens of q/out: num_heads * head_dim
  int64_t kv_row_stride;  // the same for k/v: num_heads_k * head_dim
  // Query row i of a sequence sees key j iff i + (len_k - len_q) - window_left <= j <=
  // i + (len_k - len_q) + window_right; causal is window_right = 0; kUnboundedWindow = no bound.
  int window_left;
  int window_right;
  // Scores are pre = q.k (or tanh(q.k * softcap_input_scale) with softcap); the softmax uses
  // exp2(pre * exp2_scale - max * exp2_scale) and lse = max * lse_scale + log(sum).
  float exp2_scale;
  float lse_scale;
  float softcap_input_scale;  // softmax_scale / softcap
  bool softcap;
};

}  // namespace attnserve::kernels
