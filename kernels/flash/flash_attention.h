// The flash kernel family: FlashAttention-2-class kernels of our own for compute capability
// >= 8.0, behind the plain API of kernels/attention_params.h.
#pragma once

#include "kernels/attention_params.h"

namespace attnserve::kernels::flash {

// Forward over packed varlen fp16/bf16 tensors in device memory (q, k, v, out, lse and the
// device copies of cu_seqlens), on ctx.stream of the current device. Head dims: multiples of 8
// up to 256. Returns an error, never crashes, for what it cannot run (fp32, other head dims,
// pre-sm80 devices, misaligned pointers) so the caller can route elsewhere. Asynchronous: a
// successful return means the kernel was launched.
KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx);

}  // namespace attnserve::kernels::flash
