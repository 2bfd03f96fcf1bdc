#include "kernels/cublas/cublas_common.h"

#include "kernels/cublas/row_kernels.h"
#include "kernels/dropout_mask.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cublas/cublas_attention.h"
#include "kernels/gpu_device.h"

namespace attnserve::kernels::cublas {
namespace {

// Query heads index gridDim.y of the row kernels.
constexpr int kMaxHeads = 65535;
constexpr int kMinComputeCapability = 70;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

KernelStatus ValidateOffsets(const int32_t* cu, int batch, int64_t total, const char* name,
                             const char* total_name) {
  const std::string field(name);
  if (batch == 0) {
    if (total != 0) {
      return Error("batch is 0 but " + std::string(total_name) + " is " + std::to_string(total));
    }
    return KernelStatus::Ok();
  }
  if (cu == nullptr) return Error(field + " (host copy) is required");
  if (cu[0] != 0) return Error(field + "[0] must be 0, got " + std::to_string(cu[0]));
  for (int b = 0; b < batch; ++b) {
    if (cu[b + 1] < cu[b]) return Error(field + " decreases at index " + std::to_string(b + 1));
    // Score rows are padded to whole granules and must stay within cuBLAS' int range.
    if (int64_t{cu[b + 1]} - cu[b] > kIntMax - kScoreRowGranule) {
      return Error(field + ": sequence " + std::to_string(b) + " is too long");
    }
  }
  if (cu[batch] != total) {
    return Error(field + "[batch] is " + std::to_string(cu[batch]) + " but " + total_name +
                 " is " + std::to_string(total));
  }
  return KernelStatus::Ok();
}

uintptr_t AlignUp(uintptr_t x, uintptr_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// Calls fn(len_q, len_k) for every sequence with rows and keys: the real ones from the host
// cu_seqlens, else one bound from max_seqlen (or the totals).
template <typename Fn>
void ForEachSequenceBound(const AttentionShape& s, Fn&& fn) {
  if (s.batch > 0 && s.cu_seqlens_q != nullptr && s.cu_seqlens_k != nullptr) {
    for (int b = 0; b < s.batch; ++b) {
      const Sequence seq = GetSequence(s, b);
      if (seq.len_q > 0 && seq.len_k > 0) fn(seq.len_q, seq.len_k);
    }
    return;
  }
  const int64_t len_q = s.max_seqlen_q > 0 ? s.max_seqlen_q : s.total_q;
  const int64_t len_k = s.max_seqlen_k > 0 ? s.max_seqlen_k : s.total_k;
  if (s.batch > 0 && len_q > 0 && len_k > 0 && s.num_heads > 0 && s.num_heads_k > 0 &&
      s.head_dim > 0) {
    fn(len_q, len_k);
  }
}

bool Countable(const AttentionShape& s) {
  return s.num_heads >= 1 && s.num_heads_k >= 1 && s.num_heads % s.num_heads_k == 0 &&
         s.head_dim >= 1;
}

// Alignment slack for an unaligned ctx.workspace plus the cuBLAS part.
constexpr size_t kWorkspaceOverhead = kRegionAlignment + kCublasWorkspaceBytes;

}  // namespace

KernelStatus Error(const std::string& message) { return KernelStatus::Error("cublas: " + message); }

KernelStatus ValidateShapeAndOptions(const AttentionShape& s, const AttentionOptions& o) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16 && s.dtype != DType::kFloat32) {
    return Error("unknown dtype");
  }
  if (s.batch < 0) return Error("batch must be >= 0");
  if (s.total_q < 0 || s.total_k < 0) return Error("total_q and total_k must be >= 0");
  if (s.num_heads < 1 || s.num_heads_k < 1 || s.num_heads > kMaxHeads ||
      s.num_heads % s.num_heads_k != 0) {
    return Error("num_heads (" + std::to_string(s.num_heads) + ") must be a multiple of " +
                 "num_heads_k (" + std::to_string(s.num_heads_k) + "), both in [1, " +
                 std::to_string(kMaxHeads) + "]");
  }
  if (s.head_dim < 1) return Error("head_dim must be >= 1, got " + std::to_string(s.head_dim));
  if (int64_t{s.num_heads} * s.head_dim > kIntMax) {
    return Error("num_heads * head_dim must fit cuBLAS' int leading dimensions");
  }
  KernelStatus status = ValidateOffsets(s.cu_seqlens_q, s.batch, s.total_q, "cu_seqlens_q",
                                        "total_q");
  if (!status.ok) return status;
  status = ValidateOffsets(s.cu_seqlens_k, s.batch, s.total_k, "cu_seqlens_k", "total_k");
  if (!status.ok) return status;
  if (!(std::isfinite(o.softmax_scale) && o.softmax_scale > 0.0f)) {
    return Error("softmax_scale must be resolved: finite and > 0");
  }
  if (!(std::isfinite(o.softcap) && o.softcap >= 0.0f)) {
    return Error("softcap must be finite and >= 0");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckPointer(const void* data, int64_t elements, const char* name) {
  if (elements > 0 && data == nullptr) {
    return Error(std::string(name) + " is null but has " + std::to_string(elements) +
                 " elements");
  }
  return KernelStatus::Ok();
}

KernelStatus CheckDevice(const ExecutionContext& ctx) {
  if (ctx.compute_capability != 0 && ctx.compute_capability < kMinComputeCapability) {
    return Error("compute_capability " + std::to_string(ctx.compute_capability) +
                 " requested; this family runs on 7.0 and newer");
  }
  GpuDevice gpu;
  const char* failed_call = nullptr;
  if (const cudaError_t err = QueryCurrentGpu(&gpu, &failed_call); err != cudaSuccess) {
    return Error(std::string("querying the device failed: ") + cudaGetErrorString(err));
  }
  if (gpu.compute_capability < kMinComputeCapability) {
    return Error("needs compute capability >= 7.0, device " + std::to_string(gpu.device) +
                 " has " + std::to_string(gpu.compute_capability / 10) + "." +
                 std::to_string(gpu.compute_capability % 10));
  }
  return KernelStatus::Ok();
}

Sequence GetSequence(const AttentionShape& shape, int b) {
  const int64_t q_begin = shape.cu_seqlens_q[b];
  const int64_t k_begin = shape.cu_seqlens_k[b];
  return {q_begin, shape.cu_seqlens_q[b + 1] - q_begin, k_begin,
          shape.cu_seqlens_k[b + 1] - k_begin, b};
}

Windows NormalizedWindows(const AttentionOptions& options) {
  Windows w{options.window_left < 0 ? -1 : options.window_left,
            options.window_right < 0 ? -1 : options.window_right};
  if (options.causal) w.right = 0;  // j <= diagonal, and any right window is wider
  return w;
}

KeySpan ChunkKeys(const Windows& windows, const Sequence& seq, int64_t row_begin,
                  int64_t row_end) {
  // Row i is aligned with key i + len_k - len_q; both ends of its range grow with i.
  const int64_t shift = seq.len_k - seq.len_q;
  KeySpan span{0, seq.len_k - 1};
  if (windows.left >= 0) span.first = std::max<int64_t>(0, row_begin + shift - windows.left);
  if (windows.right >= 0) {
    span.last = std::min<int64_t>(span.last, row_end - 1 + shift + windows.right);
  }
  return span;
}

ChunkGeometry GeometryOf(Pass pass, const AttentionShape& shape, int64_t len_k) {
  return {pass, shape.dtype, shape.num_heads / shape.num_heads_k, shape.head_dim, len_k};
}

size_t MinimumWorkspace(Pass pass, const AttentionShape& shape) {
  if (!Countable(shape)) return 0;
  int64_t longest_k = 0;
  ForEachSequenceBound(shape, [&](int64_t, int64_t len_k) {
    longest_k = std::max(longest_k, len_k);
  });
  if (longest_k == 0) return 0;
  return SaturatingAdd(kWorkspaceOverhead,
                       ScratchBound(GeometryOf(pass, shape, longest_k), 1, 1));
}

size_t WantedWorkspace(Pass pass, const AttentionShape& shape) {
  const size_t minimum = MinimumWorkspace(pass, shape);
  if (minimum == 0) return 0;
  size_t wanted = 0;
  ForEachSequenceBound(shape, [&](int64_t len_q, int64_t len_k) {
    wanted = std::max(wanted, ScratchBound(GeometryOf(pass, shape, len_k), shape.num_heads_k,
                                           len_q));
  });
  wanted = std::min(SaturatingAdd(kWorkspaceOverhead, wanted), kMaxWorkspaceBytes);
  return std::max(wanted, minimum);
}

KernelStatus SplitWorkspace(const ExecutionContext& ctx, size_t minimum, const char* pass,
                            Workspace* workspace) {
  *workspace = Workspace{};
  if (minimum == 0) return KernelStatus::Ok();
  if (ctx.workspace_bytes < minimum || ctx.workspace == nullptr) {
    return Error(std::string(pass) + " needs a workspace of at least " +
                 std::to_string(minimum) + " bytes (Minimum" +
                 (std::string(pass) == "forward" ? "Forward" : "Backward") +
                 "WorkspaceBytes: " + std::to_string(kCublasWorkspaceBytes) +
                 " for cuBLAS plus one query row against the longest sequence's keys), got " +
                 std::to_string(ctx.workspace == nullptr ? 0 : ctx.workspace_bytes));
  }
  const uintptr_t raw = reinterpret_cast<uintptr_t>(ctx.workspace);
  const uintptr_t base = AlignUp(raw, kRegionAlignment);
  const size_t usable = ctx.workspace_bytes - (base - raw);
  workspace->cublas = reinterpret_cast<void*>(base);
  workspace->cublas_bytes = kCublasWorkspaceBytes;
  workspace->scratch = reinterpret_cast<char*>(base) + kCublasWorkspaceBytes;
  workspace->scratch_bytes = usable - kCublasWorkspaceBytes;
  return KernelStatus::Ok();
}

KernelStatus CudaError(const char* what, cudaError_t err) {
  return Error(std::string(what) + " failed: " + cudaGetErrorString(err));
}

void SetChunkOptions(const AttentionOptions& options, const DeviceAlibiSlopes& slopes, int b,
                     RowChunk* chunk) {
  chunk->alibi = slopes.Row(b);
  chunk->dropout = options.has_dropout();
  if (!chunk->dropout) return;
  chunk->sequence = int64_t{options.first_sequence} + b;
  chunk->dropout_seed = options.dropout_seed;
  chunk->dropout_threshold = DropoutThreshold(options.dropout_p);
  chunk->dropout_scale = 1.0f / (1.0f - options.dropout_p);
}

}  // namespace attnserve::kernels::cublas
