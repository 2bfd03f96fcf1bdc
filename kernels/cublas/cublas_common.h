// Pieces the cublas family's forward and backward share: checks, sequence and key spans, the
// workspace split, and the per-sequence chunk geometry.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/gpu_alibi_slopes.h"
#include "kernels/cublas/chunk_plan.h"

namespace attnserve::kernels::cublas {

KernelStatus Error(const std::string& message);  // prefixes "cublas: "
KernelStatus CudaError(const char* what, cudaError_t err);  // "cublas: <what> failed: ..."

// Shape, offsets (the host cu_seqlens are required when batch > 0), options and the GEMM index
// ranges. Pointers are checked by the callers.
KernelStatus ValidateShapeAndOptions(const AttentionShape& shape, const AttentionOptions& options);

// Error when a tensor with `elements` > 0 elements has no pointer.
KernelStatus CheckPointer(const void* data, int64_t elements, const char* name);

// compute capability >= 7.0, of the current device and of ctx.compute_capability when set.
KernelStatus CheckDevice(const ExecutionContext& ctx);

struct Sequence {
  int64_t q_begin;
  int64_t len_q;
  int64_t k_begin;
  int64_t len_k;
  int index;  // b, within this launch
};
Sequence GetSequence(const AttentionShape& shape, int b);

// Windows as the kernels see them: < 0 unbounded, causal folded into window_right = 0.
struct Windows {
  int64_t left;
  int64_t right;
};
Windows NormalizedWindows(const AttentionOptions& options);

// Keys [first, last] of the sequence that rows [row_begin, row_end) see together (the hull of
// their visible ranges, which are monotonic in the row); empty when first > last.
struct KeySpan {
  int64_t first;
  int64_t last;
  bool empty() const { return first > last; }
  int64_t width() const { return last - first + 1; }
};
KeySpan ChunkKeys(const Windows& windows, const Sequence& seq, int64_t row_begin,
                  int64_t row_end);

// The chunk geometry of sequence lengths (len_k) for a pass.
ChunkGeometry GeometryOf(Pass pass, const AttentionShape& shape, int64_t len_k);

// The smallest and the wanted workspace for a pass over `shape` (see cublas_attention.h). With
// host cu_seqlens the real sequence lengths; else max_seqlen_q/_k when set, else total_q/_k.
size_t MinimumWorkspace(Pass pass, const AttentionShape& shape);
size_t WantedWorkspace(Pass pass, const AttentionShape& shape);

// The ALiBi and dropout settings of sequence b's chunks (RowChunk's alibi, dropout fields).
struct RowChunk;
void SetChunkOptions(const AttentionOptions& options, const DeviceAlibiSlopes& slopes, int b,
                     RowChunk* chunk);

// ctx.workspace split into the cuBLAS part and the chunk scratch, both 256-byte aligned.
struct Workspace {
  void* cublas = nullptr;
  size_t cublas_bytes = 0;
  char* scratch = nullptr;
  size_t scratch_bytes = 0;
};
// Error naming both numbers when ctx.workspace_bytes < minimum (or the pointer is null).
KernelStatus SplitWorkspace(const ExecutionContext& ctx, size_t minimum, const char* pass,
                            Workspace* workspace);

}  // namespace attnserve::kernels::cublas
