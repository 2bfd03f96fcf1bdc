// The cublas family's own small kernels around the GEMMs: the row softmax (forward), the dS row
// kernel (backward), and the fills and conversions. Host-callable launchers; all asynchronous on
// `stream`, each checked with cudaGetLastError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_params.h"

namespace attnserve::kernels::cublas {

// One chunk of score rows: `heads` query heads (global head_begin ..) x `rows` query rows x
// `width` keys, stored [head][row][ld] (fp32). Row r is query row_begin + r of its sequence
// (global row token_begin + r); column c is key key_begin + c of the sequence.
struct RowChunk {
  int rows = 0;
  int heads = 0;
  int width = 0;
  int64_t ld = 0;
  int64_t row_begin = 0;
  int64_t key_begin = 0;
  int64_t len_q = 0;
  int64_t len_k = 0;
  int64_t token_begin = 0;
  int64_t total_q = 0;
  int num_heads = 0;
  int head_begin = 0;
  int head_dim = 0;
  float scale = 0.0f;
  float softcap = 0.0f;      // 0 = off
  int64_t window_left = -1;  // < 0 unbounded
  int64_t window_right = -1; // < 0 unbounded; causal is 0
  // ALiBi: the slopes of this chunk's sequence by query head (device memory; null = off).
  const float* alibi = nullptr;
  // Dropout (kernels/dropout_mask.h): the request's index of the sequence, the seed, the keep
  // threshold and 1 / (1 - p) for kept entries.
  bool dropout = false;
  int64_t sequence = 0;
  uint64_t dropout_seed = 0;
  uint32_t dropout_threshold = 0;
  float dropout_scale = 1.0f;
};

// Forward: scores -> P = exp(score - lse) over the visible keys, 0 elsewhere, written to `probs`
// (element type of `dtype`; for fp32 it may be `scores` itself), and lse[h][token] (+inf for a
// row that sees no key, whose P row is all 0). The score is scale * q.k, softcapped, less the
// ALiBi bias; with dropout, `probs` holds the dropped and rescaled P that multiplies V (lse is
// the undropped softmax's).
KernelStatus LaunchForwardSoftmax(DType dtype, const RowChunk& chunk, const float* scores,
                                  void* probs, float* lse, cudaStream_t stream);

// Backward: from S (scores), dP (dprobs) and lse, writes P (probs) and
// dS = P * (dP - D) * dscore/d(q.k) with D = rowsum(dO * O) = sum_j P_j dP_j (dscores), both in
// the element type of `dtype` (for fp32 they may alias scores and dprobs). Rows with
// lse = +inf or no visible key get zero rows. With dropout (mask Z, scale 1 / (1 - p)), `probs`
// is Z * P * scale (for dV) and dP is replaced by Z * dP * scale before D and dS.
KernelStatus LaunchBackwardScores(DType dtype, const RowChunk& chunk, const float* scores,
                                  const float* dprobs, void* probs, void* dscores,
                                  const float* lse, cudaStream_t stream);

// Zeroes rows [first_token, first_token + rows) of heads [head_begin, head_begin + heads) of a
// [total, num_heads, head_dim] tensor and, when lse is set, sets their lse to +inf.
KernelStatus LaunchZeroRows(DType dtype, void* tensor, int64_t first_token, int64_t rows,
                            int num_heads, int head_begin, int heads, int head_dim, float* lse,
                            int64_t total_q, cudaStream_t stream);

// Stores an fp32 accumulator [heads][keys][head_dim] into rows [first_key, first_key + keys) and
// heads [head_begin, head_begin + heads) of a [total_k, num_heads_k, head_dim] tensor.
KernelStatus LaunchStoreAccumulator(DType dtype, const float* accum, void* tensor,
                                    int64_t first_key, int64_t keys, int num_heads_k,
                                    int head_begin, int heads, int head_dim, cudaStream_t stream);

}  // namespace attnserve::kernels::cublas
