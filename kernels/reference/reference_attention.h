// Exact CPU attention (fp32 accumulation, fp32 softmax) over the packed varlen layout.
// Always built; the engine's CPU device and every correctness test use it.
#pragma once

#include "kernels/attention_params.h"

namespace attnserve::kernels::reference {

// out and lse for every query row. Rows that see no key get out = 0 and lse = +inf.
// params.out may be params.q itself (the engine writes results over received inputs): each
// (row, head) of q is read once, into scratch, before out's (row, head) is written.
KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx);

// dq, dk, dv from dout, the forward's out and lse. Deterministic by construction.
KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx);

}  // namespace attnserve::kernels::reference
