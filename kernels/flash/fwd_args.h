// What the flash forward kernel gets by value: the arguments every GPU family's forward gets
// (kernels/gpu_attention_args.h).
#pragma once

#include <cstdint>

#include "kernels/gpu_attention_args.h"

namespace attnserve::kernels::flash {

using FwdKernelArgs = GpuAttentionArgs;

}  // namespace attnserve::kernels::flash
