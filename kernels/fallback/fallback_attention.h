// The fallback kernel family: memory-efficient tiled attention (no N x N matrix in device memory)
// for every CUDA GPU from compute capability 7.0 on, behind the plain API of
// kernels/attention_params.h. Coverage (dtype x head dim x compute capability x direction):
// kernels/fallback/NOTES.md.
#pragma once

#include <cstddef>

#include "kernels/attention_params.h"

namespace attnserve::kernels::fallback {

// Forward over packed varlen fp16/bf16/fp32 tensors in device memory (q, k, v, out, lse and the
// device copies of cu_seqlens), on ctx.stream of the current device. Head dims 1..256 (up to the
// largest bucket built, ATTN_FALLBACK_HEAD_DIMS). ctx.compute_capability picks the code path
// (70: wmma fp16, 75: mma.sync m16n8k8 fp16, >= 80: mma.sync m16n8k16 fp16/bf16; bf16 below 80
// and fp32 everywhere: fp32 CUDA-core math); 0 = the device's own; a path newer than the device
// is an error. Dropout and ALiBi (options.dropout_p, alibi_slopes[_device], first_sequence) run
// separate kernel instantiations; without them the kernels are unchanged. Returns an error, never
// crashes, for what it cannot run. Asynchronous.
KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx);

// Bytes of device scratch Backward needs in ctx.workspace: D = rowsum(dO * O) in float32
// (num_heads * total_q floats, rounded up to 256 bytes). 0 when total_q is 0.
size_t BackwardWorkspaceBytes(const BackwardParams& params);

// dq/dk/dv from q, k, v, out, dout and the forward's lse, same coverage as Forward. Always
// bitwise reproducible (dK/dV per key block with the GQA group summed in registers, dQ in a
// separate pass per query block; no atomics), so params.deterministic needs nothing extra.
KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx);

}  // namespace attnserve::kernels::fallback
