// Host-side pieces every GPU family needs when it turns ForwardParams / BackwardParams into
// kernel arguments: the checks of the shape every grid relies on, the backward seen as its
// forward, the softmax scales folded for exp2, the forward's kernel arguments
// (gpu_attention_args.h), and workspace alignment. One copy, so the
// families agree on them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/gpu_attention_args.h"
#include "kernels/gpu_extras.h"

namespace attnserve::kernels {

// gridDim.y and .z: batch and heads index the grid.
inline constexpr int kMaxGridYZ = 65535;

// The checks below return what is wrong ("" when nothing is); each family prefixes its name.

// Batch, head counts and totals a grid can index.
inline std::string GridShapeProblem(const AttentionShape& s) {
  if (s.batch < 0 || s.batch > kMaxGridYZ) {
    return "batch must be in [0, " + std::to_string(kMaxGridYZ) + "]";
  }
  if (s.num_heads < 1 || s.num_heads_k < 1 || s.num_heads > kMaxGridYZ ||
      s.num_heads % s.num_heads_k != 0) {
    return "num_heads must be a multiple of num_heads_k, both in [1, " +
           std::to_string(kMaxGridYZ) + "]";
  }
  if (s.total_q < 0 || s.total_k < 0) return "total_q and total_k must be >= 0";
  return "";
}

// When the host offsets are given: monotonic, ending at the totals, and no sequence longer
// than the max_seqlen the grid is sized by.
inline std::string HostOffsetsProblem(const int32_t* cu, int batch, int64_t total,
                                      int max_seqlen, const char* name) {
  if (cu == nullptr) return "";
  if (cu[0] != 0) return std::string(name) + "[0] must be 0";
  for (int b = 0; b < batch; ++b) {
    const int64_t len = int64_t{cu[b + 1]} - cu[b];
    if (len < 0) return std::string(name) + " decreases at index " + std::to_string(b + 1);
    if (len > max_seqlen) {
      return std::string(name) + ": sequence " + std::to_string(b) + " has " +
             std::to_string(len) + " tokens, more than max_seqlen " + std::to_string(max_seqlen);
    }
  }
  if (cu[batch] != total) return std::string(name) + "[batch] does not match the total";
  return "";
}

// The sequences and tensors every GPU grid relies on: the grid's shape, max_seqlen in range,
// the device offsets present and the host ones (when given) consistent, and the tensors of a
// non-empty side set.
inline std::string SequencesProblem(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  if (std::string problem = GridShapeProblem(s); !problem.empty()) return problem;
  if (s.max_seqlen_q < 0 || s.max_seqlen_k < 0 || s.max_seqlen_q > kMaxSeqLen ||
      s.max_seqlen_k > kMaxSeqLen) {
    return "max_seqlen_q/_k must be in [0, " + std::to_string(kMaxSeqLen) + "]";
  }
  if (s.batch > 0 && (s.cu_seqlens_q_device == nullptr || s.cu_seqlens_k_device == nullptr)) {
    return "cu_seqlens_q_device and cu_seqlens_k_device are required";
  }
  if (std::string problem =
          HostOffsetsProblem(s.cu_seqlens_q, s.batch, s.total_q, s.max_seqlen_q, "cu_seqlens_q");
      !problem.empty()) {
    return problem;
  }
  if (std::string problem =
          HostOffsetsProblem(s.cu_seqlens_k, s.batch, s.total_k, s.max_seqlen_k, "cu_seqlens_k");
      !problem.empty()) {
    return problem;
  }
  if (s.total_q > 0 && (p.q == nullptr || p.out == nullptr || p.lse == nullptr)) {
    return "q, out and lse must be set";
  }
  if (s.total_k > 0 && (p.k == nullptr || p.v == nullptr)) return "k and v must be set";
  return "";
}

// The options every GPU family's kernels take: a resolved softmax_scale, a finite softcap, and
// dropout / ALiBi in range (gpu_extras.h).
inline std::string OptionsProblem(const AttentionOptions& o) {
  if (!(std::isfinite(o.softmax_scale) && o.softmax_scale > 0.0f)) {
    return "softmax_scale must be resolved: finite and > 0";
  }
  if (!(std::isfinite(o.softcap) && o.softcap >= 0.0f)) return "softcap must be finite and >= 0";
  return ExtrasProblem(o);
}

// softcap: score = c * tanh(scale * qk / c). Kernels keep tanh(scale * qk / c) (or scale * qk
// without softcap) and fold c (or scale) into the exp2 and lse scales.
struct FoldedScales {
  bool softcap = false;
  float softcap_input_scale = 0.0f;  // scale / c
  float lse_scale = 0.0f;            // c with softcap, else scale
  float exp2_scale = 0.0f;           // lse_scale * log2(e)
};

inline FoldedScales FoldScales(const AttentionOptions& o) {
  constexpr float kLog2e = 1.4426950408889634f;
  FoldedScales f;
  f.softcap = o.softcap > 0.0f;
  f.softcap_input_scale = f.softcap ? o.softmax_scale / o.softcap : 0.0f;
  f.lse_scale = f.softcap ? o.softcap : o.softmax_scale;
  f.exp2_scale = f.lse_scale * kLog2e;
  return f;
}

// A window as an offset from the diagonal: negative (none) or past every key is unbounded.
inline int WindowBound(int window) {
  return window < 0 ? kUnboundedWindow : std::min(window, kUnboundedWindow);
}

// The forward's kernel arguments: pointers, strides, normalized windows (causal is a right
// window of 0) and folded scales; the backward recomputes the forward's scores with exactly
// these.
inline GpuAttentionArgs MakeGpuAttentionArgs(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const AttentionOptions& o = p.options;
  const FoldedScales scales = FoldScales(o);
  GpuAttentionArgs args{};
  args.q = p.q;
  args.k = p.k;
  args.v = p.v;
  args.out = p.out;
  args.lse = p.lse;
  args.cu_seqlens_q = s.cu_seqlens_q_device;
  args.cu_seqlens_k = s.cu_seqlens_k_device;
  args.total_q = s.total_q;
  args.num_heads = s.num_heads;
  args.head_group = s.num_heads / s.num_heads_k;
  args.head_dim = s.head_dim;
  args.q_row_stride = int64_t{s.num_heads} * s.head_dim;
  args.kv_row_stride = int64_t{s.num_heads_k} * s.head_dim;
  args.window_left = WindowBound(o.window_left);
  args.window_right = WindowBound(o.window_right);
  if (o.causal && args.window_right > 0) args.window_right = 0;
  args.softcap = scales.softcap;
  args.softcap_input_scale = scales.softcap_input_scale;
  args.lse_scale = scales.lse_scale;
  args.exp2_scale = scales.exp2_scale;
  return args;
}

// The backward as the forward that produced out and lse (shared checks and arguments); lse is
// only read.
inline ForwardParams AsForward(const BackwardParams& p) {
  ForwardParams f;
  f.shape = p.shape;
  f.options = p.options;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.out = const_cast<void*>(p.out);
  f.lse = const_cast<float*>(p.lse);
  return f;
}

// Workspace pieces start 256-byte aligned.
inline size_t AlignWorkspace(size_t bytes) {
  constexpr size_t kAlignment = 256;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace attnserve::kernels
