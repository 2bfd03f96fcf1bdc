// The cublas family's backward: per sequence, kv-head group and query chunk, recompute S = Q K^T,
// dP = dO V^T, the dS row kernel (P, D and dS), then dQ = dS K, dK += dS^T Q, dV += P^T dO.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>

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

KernelStatus ValidateBackward(const BackwardParams& p) {
  KernelStatus status = ValidateShapeAndOptions(p.shape, p.options);
  if (!status.ok) return status;
  const AttentionShape& s = p.shape;
  const int64_t q_elements = s.total_q * s.num_heads * s.head_dim;
  const int64_t kv_elements = s.total_k * s.num_heads_k * s.head_dim;
  for (const KernelStatus& check :
       {CheckPointer(p.q, q_elements, "q"), CheckPointer(p.k, kv_elements, "k"),
        CheckPointer(p.v, kv_elements, "v"), CheckPointer(p.out, q_elements, "out"),
        CheckPointer(p.dout, q_elements, "dout"),
        CheckPointer(p.lse, s.total_q * s.num_heads, "lse"),
        CheckPointer(p.dq, q_elements, "dq"), CheckPointer(p.dk, kv_elements, "dk"),
        CheckPointer(p.dv, kv_elements, "dv")}) {
    if (!check.ok) return check;
  }
  return KernelStatus::Ok();
}

// Everything one backward call shares across its chunks.
struct BackwardRun {
  const BackwardParams& params;
  cudaStream_t stream;
  cublasHandle_t handle;
  const Workspace& workspace;
  Windows windows;
  int group;
  const DeviceAlibiSlopes& slopes;
};

// Where dK and dV of kv heads [kv_begin, ..) of a sequence accumulate, from key `first` on: the
// fp32 accumulators of the workspace ([kv head][len_k][d]) for fp16/bf16, else dk/dv themselves.
struct Accumulators {
  HeadMatrix dk;
  HeadMatrix dv;
};

Accumulators AccumulatorsAt(const BackwardRun& run, const Sequence& seq, const ChunkLayout& plan,
                            int kv_begin, int64_t first) {
  const AttentionShape& s = run.params.shape;
  const int64_t d = s.head_dim;
  if (plan.has_accumulators) {
    const float* dk = reinterpret_cast<const float*>(run.workspace.scratch + plan.dk_accum);
    const float* dv = reinterpret_cast<const float*>(run.workspace.scratch + plan.dv_accum);
    return {{dk + first * d, CUDA_R_32F, d, seq.len_k * d, 0},
            {dv + first * d, CUDA_R_32F, d, seq.len_k * d, 0}};
  }
  const int64_t offset = ((seq.k_begin + first) * s.num_heads_k + kv_begin) * d;
  return {{Bytes(run.params.dk, offset, s.dtype), CUDA_R_32F, s.num_heads_k * d, d, 0},
          {Bytes(run.params.dv, offset, s.dtype), CUDA_R_32F, s.num_heads_k * d, d, 0}};
}

KernelStatus BackwardChunk(const BackwardRun& run, const Sequence& seq, const ChunkLayout& plan,
                           int kv_begin, int kv_heads, int64_t row_begin, int64_t rows) {
  const BackwardParams& p = run.params;
  const AttentionShape& s = p.shape;
  const KeySpan span = ChunkKeys(run.windows, seq, row_begin, row_begin + rows);
  if (span.empty()) return KernelStatus::Ok();  // no key seen: dq rows stay 0
  const int head_begin = kv_begin * run.group;
  const int64_t token_begin = seq.q_begin + row_begin;
  const int64_t d = s.head_dim;
  const cudaDataType_t type = CudaType(s.dtype);
  const cublasComputeType_t compute = ComputeType(s.dtype);
  const int64_t q_offset = (token_begin * s.num_heads + head_begin) * d;
  const int64_t kv_offset = ((seq.k_begin + span.first) * s.num_heads_k + kv_begin) * d;
  const int64_t q_ld = s.num_heads * d;
  const HeadMatrix q{Bytes(p.q, q_offset, s.dtype), type, q_ld, run.group * d, d};
  const HeadMatrix dout{Bytes(p.dout, q_offset, s.dtype), type, q_ld, run.group * d, d};
  const HeadMatrix dq{Bytes(p.dq, q_offset, s.dtype), type, q_ld, run.group * d, d};
  const HeadMatrix k{Bytes(p.k, kv_offset, s.dtype), type, s.num_heads_k * d, d, 0};
  const HeadMatrix v{Bytes(p.v, kv_offset, s.dtype), type, s.num_heads_k * d, d, 0};
  char* scratch = run.workspace.scratch;
  float* scores = reinterpret_cast<float*>(scratch + plan.scores);
  float* dprobs = reinterpret_cast<float*>(scratch + plan.dprobs);
  void* probs = scratch + plan.probs;
  void* dscores = scratch + plan.dscores;
  const int64_t head_stride = rows * plan.ld;
  const int64_t kv_stride = run.group * head_stride;
  const HeadMatrix scores_matrix{scores, CUDA_R_32F, plan.ld, kv_stride, head_stride};
  const HeadMatrix dprobs_matrix{dprobs, CUDA_R_32F, plan.ld, kv_stride, head_stride};
  const HeadMatrix probs_matrix{probs, type, plan.ld, kv_stride, head_stride};
  const HeadMatrix dscores_matrix{dscores, type, plan.ld, kv_stride, head_stride};
  const int64_t width = span.width();

  // S^T = K . Q^T and dP^T = V . dO^T (keys x rows, column-major).
  KernelStatus status = GemmOverHeads(run.handle, compute, {true, false, width, rows, d}, k, q,
                                      scores_matrix, 0.0f, kv_heads, run.group);
  if (!status.ok) return status;
  status = GemmOverHeads(run.handle, compute, {true, false, width, rows, d}, v, dout,
                         dprobs_matrix, 0.0f, kv_heads, run.group);
  if (!status.ok) return status;
  RowChunk chunk;
  chunk.rows = static_cast<int>(rows);
  chunk.heads = kv_heads * run.group;
  chunk.width = static_cast<int>(width);
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
  status = LaunchBackwardScores(s.dtype, chunk, scores, dprobs, probs, dscores, p.lse,
                                run.stream);
  if (!status.ok) return status;
  // dQ^T (d x rows) = K^T (d x keys) . dS^T (keys x rows); the scale is inside dS.
  status = GemmOverHeads(run.handle, compute, {false, false, d, rows, width}, k, dscores_matrix,
                         dq, 0.0f, kv_heads, run.group);
  if (!status.ok) return status;
  // dK^T (d x keys) += Q^T (d x rows) . dS (rows x keys); dV^T += dO^T . P, one query head of
  // each kv head after the other.
  const Accumulators accum = AccumulatorsAt(run, seq, plan, kv_begin, span.first);
  status = GemmOverHeads(run.handle, compute, {false, true, d, width, rows}, q, dscores_matrix,
                         accum.dk, 1.0f, kv_heads, run.group);
  if (!status.ok) return status;
  return GemmOverHeads(run.handle, compute, {false, true, d, width, rows}, dout, probs_matrix,
                       accum.dv, 1.0f, kv_heads, run.group);
}

// All chunks of kv heads [kv_begin, kv_begin + kv_heads) of one sequence.
KernelStatus BackwardKvGroup(const BackwardRun& run, const Sequence& seq, const ChunkLayout& plan,
                             int kv_begin, int kv_heads) {
  const AttentionShape& s = run.params.shape;
  const size_t accum_bytes =
      static_cast<size_t>(kv_heads) * seq.len_k * s.head_dim * sizeof(float);
  char* scratch = run.workspace.scratch;
  if (plan.has_accumulators) {
    for (const size_t offset : {plan.dk_accum, plan.dv_accum}) {
      const cudaError_t err = cudaMemsetAsync(scratch + offset, 0, accum_bytes, run.stream);
      if (err != cudaSuccess) return CudaError("cudaMemsetAsync", err);
    }
  }
  for (int64_t row = 0; row < seq.len_q; row += plan.rows) {
    const KernelStatus status = BackwardChunk(run, seq, plan, kv_begin, kv_heads, row,
                                              std::min(plan.rows, seq.len_q - row));
    if (!status.ok) return status;
  }
  if (!plan.has_accumulators) return KernelStatus::Ok();
  const KernelStatus status = LaunchStoreAccumulator(
      s.dtype, reinterpret_cast<const float*>(scratch + plan.dk_accum), run.params.dk,
      seq.k_begin, seq.len_k, s.num_heads_k, kv_begin, kv_heads, s.head_dim, run.stream);
  if (!status.ok) return status;
  return LaunchStoreAccumulator(s.dtype, reinterpret_cast<const float*>(scratch + plan.dv_accum),
                                run.params.dv, seq.k_begin, seq.len_k, s.num_heads_k, kv_begin,
                                kv_heads, s.head_dim, run.stream);
}

}  // namespace

size_t MinimumBackwardWorkspaceBytes(const BackwardParams& params) {
  return MinimumWorkspace(Pass::kBackward, params.shape);
}

size_t BackwardWorkspaceBytes(const BackwardParams& params) {
  return WantedWorkspace(Pass::kBackward, params.shape);
}

KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx) {
  KernelStatus status = ValidateBackward(params);
  if (!status.ok) return status;
  status = CheckDevice(ctx);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  Workspace workspace;
  status = SplitWorkspace(ctx, MinimumBackwardWorkspaceBytes(params), "backward", &workspace);
  if (!status.ok) return status;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  // Gradients no chunk writes (rows and keys nobody sees, empty sequences) are 0; dk/dv of fp32
  // accumulate in place from 0.
  const size_t element = DTypeSize(s.dtype);
  const size_t q_bytes = static_cast<size_t>(s.total_q) * s.num_heads * s.head_dim * element;
  const size_t kv_bytes = static_cast<size_t>(s.total_k) * s.num_heads_k * s.head_dim * element;
  for (const auto& [tensor, bytes] : {std::pair<void*, size_t>{params.dq, q_bytes},
                                      {params.dk, kv_bytes}, {params.dv, kv_bytes}}) {
    if (bytes == 0) continue;
    const cudaError_t err = cudaMemsetAsync(tensor, 0, bytes, stream);
    if (err != cudaSuccess) return CudaError("cudaMemsetAsync", err);
  }
  if (workspace.cublas == nullptr) return KernelStatus::Ok();  // nothing to multiply
  cublasHandle_t handle = nullptr;
  status = BindHandle(stream, workspace.cublas, workspace.cublas_bytes, &handle);
  if (!status.ok) return status;
  DeviceAlibiSlopes slopes;
  if (const std::string failed = slopes.Init(params.options, s, stream); !failed.empty()) {
    return Error(failed);
  }
  const BackwardRun run{params, stream, handle, workspace, NormalizedWindows(params.options),
                        s.num_heads / s.num_heads_k, slopes};
  for (int b = 0; b < s.batch; ++b) {
    const Sequence seq = GetSequence(s, b);
    if (seq.len_q == 0 || seq.len_k == 0) continue;
    ChunkLayout plan;
    if (!PlanChunks(GeometryOf(Pass::kBackward, s, seq.len_k), s.num_heads_k, seq.len_q,
                    workspace.scratch_bytes, &plan)) {
      return Error("internal error: no chunk of sequence " + std::to_string(b) +
                   " fits the workspace");
    }
    for (int kv_begin = 0; kv_begin < s.num_heads_k; kv_begin += plan.kv_heads) {
      status = BackwardKvGroup(run, seq, plan, kv_begin,
                               std::min(plan.kv_heads, s.num_heads_k - kv_begin));
      if (!status.ok) return status;
    }
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::cublas
