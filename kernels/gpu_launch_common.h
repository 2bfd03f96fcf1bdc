// Host-side pieces every GPU family needs when it turns ForwardParams / BackwardParams into
// kernel arguments: the backward seen as its forward, the softmax scales folded for exp2, and
// workspace alignment. One copy, so the families agree on them.
#pragma once

#include <cstddef>

#include "kernels/attention_params.h"

namespace attnserve::kernels {

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
