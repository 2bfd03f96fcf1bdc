// The cublas kernel family: attention as cuBLAS GEMMs plus small row kernels of our own, for
// what the tiled kernels do not cover (fp32, head dims of any size, pre-Ampere devices). Any
// dtype (fp16/bf16/fp32), any head_dim >= 1, every option (varlen, GQA/MQA, bottom-right causal,
// sliding window, softcap, lse out), forward and backward, on compute capability >= 7.0: the row
// kernels carry PTX for the oldest architecture the toolkit knows besides the build's own SASS
// (compute_70 with CUDA 12; CUDA 13 and its cuBLAS stop at sm_75). One code path for all devices,
// so ExecutionContext::compute_capability is only checked (>= 70).
//
// Algorithm: per sequence, per group of kv heads and per chunk of query rows,
//   forward:  S = Q K^T (fp32), a row kernel turns S into P = exp(score - lse) (masked entries
//             0) and writes lse, then out = P V (P in the input dtype for fp16/bf16, as flash
//             does);
//   backward: recompute S, dP = dO V^T, a row kernel forms D = rowsum(dO * O) as
//             sum_j P_j dP_j (from fp32 P and dP, not from the dtype-rounded out) and
//             dS = P * (dP - D) * dscore/d(q.k) (scale and softcap folded in), then
//             dQ = dS K, dK += dS^T Q, dV += P^T dO, dK/dV accumulated in fp32 (in the workspace
//             for fp16/bf16, directly in dk/dv for fp32).
// A chunk only multiplies the keys its rows can see (its causal/window span). GEMMs use
// CUBLAS_COMPUTE_32F, pedantic (no TF32) for fp32 inputs.
//
// Workspace: all scratch comes from ctx.workspace (no allocation per call). Its first
// kCublasWorkspaceBytes (256-byte aligned) go to cuBLAS through cublasSetWorkspace, so our GEMMs
// never use cuBLAS' own per-stream workspace pool (no hidden allocation, and cuBLAS picks its
// algorithms against a fixed workspace); the rest holds one chunk's score buffers and, in the
// fp16/bf16 backward, the fp32 dK/dV accumulators of the chunk's kv heads. Forward/Backward size their chunks from ctx.workspace_bytes, so any
// workspace >= Minimum*WorkspaceBytes runs (a smaller one is an error that names both numbers);
// *WorkspaceBytes is what the family wants: enough for one chunk per sequence with all heads,
// capped at kMaxWorkspaceBytes, but never below the minimum.
//
// Determinism: always bitwise reproducible for the same inputs, workspace size and device (and
// cuBLAS version): no atomics; every GEMM runs on ctx.stream against the same fixed cuBLAS
// workspace, row reductions have a fixed order, and dK/dV sum over chunks and heads in a fixed
// sequential order. params.deterministic is therefore honoured trivially. A different workspace
// size changes the chunking (and with it the summation order and cuBLAS' choice of algorithm),
// so results may differ in the last bits between workspace sizes.
//
// cuBLAS handles: one per (device, host thread), created on first use and kept for the
// process's lifetime (gemm.cc says why); every call binds it to ctx.stream. Everything is asynchronous on
// ctx.stream: host work is planning from the host copies of cu_seqlens, no synchronization.
#pragma once

#include <cstddef>

#include "kernels/attention_params.h"

namespace attnserve::kernels::cublas {

// Bytes of ctx.workspace handed to cuBLAS (cublasSetWorkspace).
constexpr size_t kCublasWorkspaceBytes = size_t{4} << 20;
// Cap on what *WorkspaceBytes ask for (the minimum may exceed it for very long sequences).
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

// The smallest workspace Forward runs with: the cuBLAS part plus fp32 scores (and, for
// fp16/bf16, 16-bit probabilities) of one query row of one kv head's query heads against the
// longest sequence's keys, plus alignment. 0 when there is nothing to multiply.
size_t MinimumForwardWorkspaceBytes(const ForwardParams& params);

// What Forward wants: one chunk per sequence covering all its rows and heads, capped at
// kMaxWorkspaceBytes, at least MinimumForwardWorkspaceBytes. Uses the host cu_seqlens when
// given, else max_seqlen_q/_k when set, else total_q/_k as the bounds of a sequence.
size_t ForwardWorkspaceBytes(const ForwardParams& params);

// Forward over packed varlen tensors in device memory (q, k, v, out, lse), driven by the host
// cu_seqlens (required when batch > 0; the device copies are not used). Rows that see no key get
// out = 0 and lse = +inf. Returns an error, never crashes, for what it cannot run.
KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx);

// The smallest workspace Backward runs with: the cuBLAS part, for fp16/bf16 the fp32 dK and dV
// accumulators of one kv head of the longest sequence, and the scores, dP (fp32) and 16-bit P,
// dS of one query row of one kv head's query heads, plus alignment.
size_t MinimumBackwardWorkspaceBytes(const BackwardParams& params);

// What Backward wants, sized like ForwardWorkspaceBytes.
size_t BackwardWorkspaceBytes(const BackwardParams& params);

// Backward from q, k, v, dout and the forward's lse: dq like q, dk/dv like k/v. `out` is checked
// but not read (D comes from P and dP). Rows with lse = +inf (they saw no key) and keys no row
// sees get zero gradients.
KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx);

}  // namespace attnserve::kernels::cublas
