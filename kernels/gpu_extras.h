// Dropout and ALiBi as the tiled GPU families' kernels take them (flash's sm80 extras kernels and
// fallback's, both instantiated with kExtras only for requests that carry either option): the
// arguments the kernels read, which requests carry them, their checks, and the arguments made
// from AttentionOptions. One copy, so the families agree on them (the mask's contract is
// kernels/dropout_mask.h, the semantics kernels/attention_params.h).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/dropout_mask.h"
#include "kernels/gpu_alibi_slopes.h"

namespace attnserve::kernels {

struct ExtrasArgs {
  // ALiBi: the slope of (sequence b of the launch, query head h) is
  // alibi_slopes[b * alibi_stride + h] (device; already offset to the launch's first sequence);
  // null = off. alibi_to_pre turns a bias in score units into the kernels' pre-score units (the
  // scores before exp2_scale: q.k, or tanh with softcap): 1 / lse_scale.
  const float* alibi_slopes;
  int alibi_stride;
  float alibi_to_pre;
  // Dropout (kernels/dropout_mask.h): off when !dropout; an element is kept iff its Philox bits
  // are >= dropout_threshold, kept ones scaled by dropout_scale = 1 / (1 - p).
  uint64_t dropout_seed;
  uint32_t dropout_threshold;
  float dropout_scale;
  int first_sequence;  // the request's index of the launch's sequence 0 (the mask's counter)
  bool dropout;
};

inline bool HasExtras(const AttentionOptions& o) { return o.has_dropout() || o.has_alibi(); }

// What is wrong with the options' dropout/ALiBi fields; "" when nothing is (each family
// prefixes its name).
inline std::string ExtrasProblem(const AttentionOptions& o) {
  if (!(o.dropout_p >= 0.0f && o.dropout_p < 1.0f)) return "dropout_p must be in [0, 1)";
  if (o.first_sequence < 0) return "first_sequence must be >= 0";
  if (o.has_alibi() && o.alibi_slopes_stride < 0) return "alibi_slopes_stride must be >= 0";
  return "";
}

// `lse_scale`: the forward's FoldedScales::lse_scale (a pre-score times it is a score);
// `slopes` already holds the launch's device slopes.
inline ExtrasArgs MakeExtrasArgs(const AttentionOptions& o, float lse_scale,
                                 const DeviceAlibiSlopes& slopes) {
  ExtrasArgs x{};
  x.alibi_slopes = slopes.base();
  x.alibi_stride = slopes.stride();
  x.alibi_to_pre = 1.0f / lse_scale;
  x.dropout = o.has_dropout();
  x.dropout_seed = o.dropout_seed;
  x.dropout_threshold = DropoutThreshold(o.dropout_p);
  x.dropout_scale = x.dropout ? 1.0f / (1.0f - o.dropout_p) : 1.0f;
  x.first_sequence = o.first_sequence;
  return x;
}

}  // namespace attnserve::kernels
