// The flash kernel family: FlashAttention-2-class kernels of our own for compute capability
// >= 8.0, and their Turing variant for 7.5 (fp16, head_dim <= 64, as FlashAttention 1 ran there),
// behind the plain API of kernels/attention_params.h. The code path follows
// ctx.compute_capability (0 = the current device's own; an older path runs on a newer GPU).
#pragma once

#include <cstddef>
#include <string_view>

#include "kernels/attention_params.h"

namespace attnserve::kernels::flash {

// Forward over packed varlen fp16/bf16 tensors in device memory (q, k, v, out, lse and the
// device copies of cu_seqlens), on ctx.stream of the current device. Head dims: multiples of 8
// up to 256. Returns an error, never crashes, for what it cannot run (fp32, other head dims,
// devices below 7.5, bf16 or head_dim > 64 on the 7.5 path, misaligned pointers) so the
// caller can route elsewhere. Asynchronous: a successful return means the kernel was launched.
KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx);

// Bytes of device scratch Backward needs in ctx.workspace (16-byte aligned; the caller allocates
// it): D = rowsum(dO * O) in float32 (num_heads * total_q floats) and, unless
// params.deterministic, a float32 dQ accumulator (total_q * num_heads * head_dim floats), each
// rounded up to 256 bytes; no accumulator on the Hopper path ("sm90", the plan's code_path) at
// head dims 200-256, where dQ is a pass of its own in both modes. An empty code_path: whichever
// path runs. 0 when total_q is 0.
size_t BackwardWorkspaceBytes(const BackwardParams& params, std::string_view code_path = {});

// FlashAttention-2's backward over the same packed layout: dq like q, dk/dv like k/v, from q, k,
// v, out, dout and the forward's lse. Head dims: multiples of 8 up to 256 (the kernels need 119 KB
// of shared memory per block at 192 and 150 KB at 256; a device that gives less gets an error).
// dK/dV of a GQA group are summed in fp32 registers (always deterministic). dQ: by default
// FlashAttention-2's float32 atomics from the dK/dV kernel (run-to-run bits may differ); with
// params.deterministic a separate dQ pass over the key blocks (bitwise reproducible, about 1.4x
// the matrix work of the atomic scheme, no dQ workspace; on Hopper the sm90 dQ kernel). On
// Hopper at head dims 200-256 dQ is always such a pass, so both modes are bitwise reproducible
// there. Returns an error naming the size when ctx.workspace is smaller than
// BackwardWorkspaceBytes(params).
// Asynchronous, like Forward.
KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx);

}  // namespace attnserve::kernels::flash
