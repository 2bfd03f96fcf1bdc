// Dropout and ALiBi ("extras") for the sm80 kernels: what an extras instantiation gets beyond the
// plain kernel arguments. The plain structs stay as they are and the extras ones derive from them
// with the ExtrasArgs appended, so the kernels without extras (kExtras = false) keep exactly
// their parameter layout and machine code (NOTES.md "Dropout and ALiBi").
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/fwd_args.h"

namespace attnserve::kernels::flash {

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

struct FwdKernelArgsX : FwdKernelArgs {
  ExtrasArgs x;
};
struct BwdKernelArgsX : BwdKernelArgs {
  ExtrasArgs x;
};

template <bool kExtras>
using FwdArgsOf = std::conditional_t<kExtras, FwdKernelArgsX, FwdKernelArgs>;
template <bool kExtras>
using BwdArgsOf = std::conditional_t<kExtras, BwdKernelArgsX, BwdKernelArgs>;

}  // namespace attnserve::kernels::flash
