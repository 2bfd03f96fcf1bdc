// The cublas family's forward: per sequence, kv-head group and query chunk, S = Q K^T, the row
// softmax (P and lse), out = P V.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "kernels/cublas/chunk_plan.h"
#include "kernels/cublas/cublas_attention.h"
#include "kernels/cublas/cublas_common.h"
#include "kernels/cublas/gemm.h"
#include "kernels/cublas/row_kernels.h"

namespace attnserve::kernels::cublas {
namespace {

const char* Bytes(const void* data, int64_t elements, DType dtype) {
  return static_cast<const char*>(data) + elements * DTypeSize(dtype);
}

KernelStatus ValidateForward(const ForwardParams& p) {
  KernelStatus status = ValidateShapeAndOptions(p.shape, p.options);
  if (!status.ok) return status;
  const AttentionShape& s = p.shape;
  const int64_t q_elements = s.total_q * s.num_heads * s.head_dim;
  const int64_t kv_elements = s.total_k * s.num_heads_k * s.head_dim;
  for (const KernelStatus& check :
       {CheckPointer(p.q, q_elements, "q"), CheckPointer(p.k, kv_elements, "k"),
        CheckPointer(p.v, kv_elements, "v"), CheckPointer(p.out, q_elements, "out"),
        CheckPointer(p.lse, s.total_q * s.num_heads, "lse")}) {
    if (!check.ok) return check;
  }
  return KernelStatus::Ok();
}

// Everything one forward call shares across its chunks.
struct ForwardRun {
  const ForwardParams& params;
  cudaStream_t stream;
  cublasHandle_t handle;
  const Workspace& workspace;
  Windows windows;
  int group;
  const DeviceAlibiSlopes& slopes;
};

// Rows [row_begin, row_begin + rows) of kv heads [kv_begin, kv_begin + kv_heads) (and their
// query heads) of one sequence.
KernelStatus ForwardChunk(const ForwardRun& run, const Sequence& seq, const ChunkLayout& plan,
                          int kv_begin, int kv_heads, int64_t row_begin, int64_t rows) {
  const ForwardParams& p = run.params;
  const AttentionShape& s = p.shape;
  const int head_begin = kv_begin * run.group;
  const int heads = kv_heads * run.group;
  const int64_t token_begin = seq.q_begin + row_begin;
  const KeySpan span = ChunkKeys(run.windows, seq, row_begin, row_begin + rows);
  if (span.empty()) {
    return LaunchZeroRows(s.dtype, p.out, token_begin, rows, s.num_heads, head_begin, heads,
                          s.head_dim, p.lse, s.total_q, run.stream);
  }
  const int64_t d = s.head_dim;
  const cudaDataType_t type = CudaType(s.dtype);
  const cublasComputeType_t compute = ComputeType(s.dtype);
  const int64_t q_offset = (token_begin * s.num_heads + head_begin) * d;
  const int64_t kv_offset = ((seq.k_begin + span.first) * s.num_heads_k + kv_begin) * d;
  const HeadMatrix q{Bytes(p.q, q_offset, s.dtype), type, s.num_heads * d, run.group * d, d};
  const HeadMatrix k{Bytes(p.k, kv_offset, s.dtype), type, s.num_heads_k * d, d, 0};
  const HeadMatrix v{Bytes(p.v, kv_offset, s.dtype), type, s.num_heads_k * d, d, 0};
  const HeadMatrix out{Bytes(p.out, q_offset, s.dtype), type, s.num_heads * d, run.group * d, d};
  float* scores = reinterpret_cast<float*>(run.workspace.scratch + plan.scores);
  void* probs = run.workspace.scratch + plan.probs;
  const int64_t head_stride = rows * plan.ld;
  const HeadMatrix scores_matrix{scores, CUDA_R_32F, plan.ld, run.group * head_stride,
                                 head_stride};
  const HeadMatrix probs_matrix{probs, type, plan.ld, run.group * head_stride, head_stride};

  // S^T (keys x rows, column-major) = K (keys x d) . Q^T (d x rows).
  KernelStatus status = GemmOverHeads(run.handle, compute, {true, false, span.width(), rows, d},
                                      k, q, scores_matrix, 0.0f, kv_heads, run.group);
  if (!status.ok) return status;
  RowChunk chunk;
  chunk.rows = static_cast<int>(rows);
  chunk.heads = heads;
  chunk.width = static_cast<int>(span.width());
  chunk.ld = plan.ld;
  chunk.row_begin = row_begin;
  chunk.key_begin = span.first;
  chunk.len_q = seq.len_q;
  chunk.len_k = seq.len_k;
  chunk.token_begin = token_begin;
  chunk.total_q = s.total_q;
  chunk.num_heads = s.num_heads;
  chunk.head_begin = head_begin;
  chunk.head_dim = s.head_dim;
  chunk.scale = p.options.softmax_scale;
  chunk.softcap = p.options.softcap;
  chunk.window_left = run.windows.left;
  chunk.window_right = run.windows.right;
  SetChunkOptions(p.options, run.slopes, seq.index, &chunk);
  status = LaunchForwardSoftmax(s.dtype, chunk, scores, probs, p.lse, run.stream);
  if (!status.ok) return status;
  // out^T (d x rows) = V^T (d x keys) . P^T (keys x rows).
  return GemmOverHeads(run.handle, compute, {false, false, d, rows, span.width()}, v,
                       probs_matrix, out, 0.0f, kv_heads, run.group);
}

}  // namespace

size_t MinimumForwardWorkspaceBytes(const ForwardParams& params) {
  return MinimumWorkspace(Pass::kForward, params.shape);
}

size_t ForwardWorkspaceBytes(const ForwardParams& params) {
  return WantedWorkspace(Pass::kForward, params.shape);
}

KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx) {
  KernelStatus status = ValidateForward(params);
  if (!status.ok) return status;
  status = CheckDevice(ctx);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  if (s.total_q == 0) return KernelStatus::Ok();
  Workspace workspace;
  status = SplitWorkspace(ctx, MinimumForwardWorkspaceBytes(params), "forward", &workspace);
  if (!status.ok) return status;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  cublasHandle_t handle = nullptr;
  if (workspace.cublas != nullptr) {
    status = BindHandle(stream, workspace.cublas, workspace.cublas_bytes, &handle);
    if (!status.ok) return status;
  }
  DeviceAlibiSlopes slopes;
  if (const std::string failed = slopes.Init(params.options, s, stream); !failed.empty()) {
    return Error(failed);
  }
  const ForwardRun run{params, stream, handle, workspace, NormalizedWindows(params.options),
                       s.num_heads / s.num_heads_k, slopes};
  for (int b = 0; b < s.batch; ++b) {
    const Sequence seq = GetSequence(s, b);
    if (seq.len_q == 0) continue;
    if (seq.len_k == 0) {
      status = LaunchZeroRows(s.dtype, params.out, seq.q_begin, seq.len_q, s.num_heads, 0,
                              s.num_heads, s.head_dim, params.lse, s.total_q, stream);
      if (!status.ok) return status;
      continue;
    }
    ChunkLayout plan;
    if (!PlanChunks(GeometryOf(Pass::kForward, s, seq.len_k), s.num_heads_k, seq.len_q,
                    workspace.scratch_bytes, &plan)) {
      return Error("internal error: no chunk of sequence " + std::to_string(b) +
                   " fits the workspace");
    }
    for (int kv_begin = 0; kv_begin < s.num_heads_k; kv_begin += plan.kv_heads) {
      const int kv_heads = std::min(plan.kv_heads, s.num_heads_k - kv_begin);
      for (int64_t row = 0; row < seq.len_q; row += plan.rows) {
        status = ForwardChunk(run, seq, plan, kv_begin, kv_heads, row,
                              std::min(plan.rows, seq.len_q - row));
        if (!status.ok) return status;
      }
    }
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::cublas
