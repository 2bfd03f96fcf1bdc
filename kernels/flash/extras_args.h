// Dropout and ALiBi ("extras") for the sm80 kernels: an extras instantiation gets the plain kernel
// arguments plus ExtrasArgs (kernels/gpu_extras.h). The plain structs stay as they are and the extras ones derive from them
// with the ExtrasArgs appended, so the kernels without extras (kExtras = false) keep exactly
// their parameter layout and machine code (NOTES.md "Dropout and ALiBi").
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/fwd_args.h"
#include "kernels/gpu_extras.h"

namespace attnserve::kernels::flash {

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
