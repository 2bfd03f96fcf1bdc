// Test oracle: dense float64 varlen attention written as directly from the definition as
// possible (one query row at a time, mask tested per (i, j)). Shares no code with kernels/.
#pragma once

#include <cstdint>
#include <vector>

namespace attnserve::kernels::test {

struct NaiveProblem {
  std::vector<int32_t> cu_seqlens_q;  // batch + 1 offsets
  std::vector<int32_t> cu_seqlens_k;
  int num_heads = 1;
  int num_heads_k = 1;
  int head_dim = 1;
  double softmax_scale = 1.0;  // resolved, never 0
  bool causal = false;
  int window_left = -1;  // negative = unbounded
  int window_right = -1;
  double softcap = 0.0;  // 0 = off
  float dropout_p = 0.0f;  // 0 = off; the mask is kernels/dropout_mask.h's
  uint64_t dropout_seed = 0;
  // ALiBi: slope of (sequence b, head h) = alibi_slopes[b * alibi_stride + h]; empty = off.
  std::vector<double> alibi_slopes;
  int alibi_stride = 0;
};

// Packed tensors as in kernels/: q/out [total_q, num_heads, head_dim], k/v [total_k,
// num_heads_k, head_dim], lse [num_heads, total_q].
struct NaiveForwardResult {
  std::vector<double> out;
  std::vector<double> lse;  // +inf for rows that see no key
};
NaiveForwardResult NaiveForward(const NaiveProblem& problem, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v);

struct NaiveGradients {
  std::vector<double> dq;
  std::vector<double> dk;
  std::vector<double> dv;
};
// Analytic gradients of sum(dout o out). `out` is used only for D = rowsum(dout o out), like
// FlashAttention's backward, so callers can pass the (rounded) out a kernel produced.
NaiveGradients NaiveBackward(const NaiveProblem& problem, const std::vector<double>& q,
                             const std::vector<double>& k, const std::vector<double>& v,
                             const std::vector<double>& out, const std::vector<double>& dout);

}  // namespace attnserve::kernels::test
