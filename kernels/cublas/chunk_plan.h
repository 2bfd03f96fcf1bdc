// How the cublas family cuts one sequence into chunks that fit the workspace: a chunk is a range
// of query rows times a range of kv heads (with all their query heads), and its buffers are laid
// out in the scratch part of the workspace. Pure host code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"

namespace attnserve::kernels::cublas {

// Every buffer of a chunk starts on this boundary (cuBLAS' and vector loads' preference).
constexpr size_t kRegionAlignment = 256;
// Score rows are padded to a multiple of this many elements (16 bytes of 16-bit P).
constexpr int64_t kScoreRowGranule = 8;

enum class Pass { kForward, kBackward };

// What a chunk's buffer sizes depend on, fixed for one sequence.
struct ChunkGeometry {
  Pass pass;
  DType dtype;
  int group;        // query heads per kv head
  int head_dim;
  int64_t len_k;    // keys of the sequence
};

// Buffers of one chunk of `kv_heads` kv heads x `rows` query rows, as byte offsets from the
// scratch base. Scores are [kv head][group head][row][ld] with ld = len_k padded:
//   scores   fp32 S (forward and backward)
//   probs    P in the GEMM dtype: the same buffer as scores for fp32, else 16-bit
//   dprobs   backward: fp32 dP
//   dscores  backward: dS in the GEMM dtype (the dprobs buffer for fp32, else 16-bit)
//   dk_accum, dv_accum  backward fp16/bf16: fp32 [kv head][len_k][head_dim] accumulators
struct ChunkLayout {
  int kv_heads = 0;
  int64_t rows = 0;
  int64_t ld = 0;
  size_t scores = 0;
  size_t probs = 0;
  size_t dprobs = 0;
  size_t dscores = 0;
  size_t dk_accum = 0;
  size_t dv_accum = 0;
  bool has_accumulators = false;
  size_t bytes = 0;  // total, saturating (never wraps)
};

int64_t ScoreStride(int64_t len_k);

ChunkLayout Layout(const ChunkGeometry& geometry, int kv_heads, int64_t rows);

// An upper bound on Layout(geometry, kv_heads, rows).bytes that is linear in rows (every region
// counted with a full alignment pad); PlanChunks keeps this within the available bytes, so
// ScratchBound(geometry, 1, 1) is the least scratch a sequence runs with.
size_t ScratchBound(const ChunkGeometry& geometry, int kv_heads, int64_t rows);

// The chunk shape for a sequence of len_q rows with num_heads_k kv heads that needs the fewest
// chunks within `available` scratch bytes (ties: more kv heads per chunk). False when not even
// one row of one kv head fits.
bool PlanChunks(const ChunkGeometry& geometry, int num_heads_k, int64_t len_q, size_t available,
                ChunkLayout* plan);

size_t SaturatingAdd(size_t a, size_t b);
size_t SaturatingMul(size_t a, size_t b);

}  // namespace attnserve::kernels::cublas
