// Host side of dropout and ALiBi in the flash family (flash_attention.cc): which requests carry
// them, their checks, and the kernels' ExtrasArgs. Only the sm80 path runs them (NOTES.md
// "Dropout and ALiBi"): Hopper requests with either take it instead of the sm90 kernels, and the
// Turing path refuses them.
#pragma once

#include <cmath>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/dropout_mask.h"
#include "kernels/flash/extras_args.h"
#include "kernels/gpu_alibi_slopes.h"

namespace attnserve::kernels::flash {

inline bool HasExtras(const AttentionOptions& o) { return o.has_dropout() || o.has_alibi(); }

// What is wrong with the options' dropout/ALiBi fields; "" when nothing is.
inline std::string ExtrasProblem(const AttentionOptions& o) {
  if (!(o.dropout_p >= 0.0f && o.dropout_p < 1.0f)) return "dropout_p must be in [0, 1)";
  if (o.first_sequence < 0) return "first_sequence must be >= 0";
  if (o.has_alibi() && o.alibi_slopes_stride < 0) return "alibi_slopes_stride must be >= 0";
  return "";
}

// `lse_scale`: the forward's FoldedScales::lse_scale (a pre-score times it is a score).
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

}  // namespace attnserve::kernels::flash
