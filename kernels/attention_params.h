// The one boundary between the engine and the kernels: plain pointers, sizes and options over
// packed varlen tensors. No gRPC, protobuf or abseil here, so kernels/ builds with only a C++
// (and CUDA) toolchain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace attnserve::kernels {

enum class DType { kFloat16, kBFloat16, kFloat32 };

inline int DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
// Inline so GPU family libraries (linked after attn_kernels) need nothing back from it.
inline const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
  }
  return "unknown";
}

// Attention semantics are FlashAttention 2.6 varlen: s = scale * q.k^T, softcap, ALiBi
// (s -= slope * |i + len_k - len_q - j| for query row i and key column j within the sequence),
// masking (bottom-right aligned causal / sliding window), softmax (lse is of this undropped P),
// dropout on P (kernels/dropout_mask.h; kept entries scaled by 1 / (1 - dropout_p)), times v.
struct AttentionOptions {
  float softmax_scale = 0.0f;  // already resolved: never 0 when a kernel sees it
  bool causal = false;
  int window_left = -1;        // -1 = unbounded
  int window_right = -1;       // -1 = unbounded (causal forces 0)
  float softcap = 0.0f;        // 0 = off
  float dropout_p = 0.0f;      // in [0, 1); 0 = off
  uint64_t dropout_seed = 0;   // the Philox key (kernels/dropout_mask.h); resolved, never 0 when on
  // ALiBi slopes, float32: the slope of (sequence b, query head h) is
  // alibi_slopes[(first_sequence + b) * alibi_slopes_stride + h], so stride 0 is one slope per
  // head ([num_heads]) and stride num_heads one row per sequence ([batch, num_heads] of the
  // whole request). Null = off. Host memory; GPU families read alibi_slopes_device when a caller
  // gives one (the C ABI takes device slopes), else copy the host slopes to the device per launch
  // (kernels/gpu_alibi_slopes.h).
  const float* alibi_slopes = nullptr;
  const float* alibi_slopes_device = nullptr;
  int alibi_slopes_stride = 0;
  // Index within the whole request of the launch's sequence 0: the engine launches sub-ranges
  // of a request's sequences (server/engine/group_launch.h), and the dropout mask and
  // [batch, num_heads] slopes are keyed by the request's own sequence index.
  int first_sequence = 0;

  bool has_dropout() const { return dropout_p > 0.0f; }
  bool has_alibi() const { return alibi_slopes != nullptr || alibi_slopes_device != nullptr; }
};

// Shapes shared by forward and backward. Tensors are packed and contiguous:
// q/out/dq [total_q, num_heads, head_dim], k/v/dk/dv [total_k, num_heads_k, head_dim],
// lse [num_heads, total_q] float32. cu_seqlens_* are host arrays of batch + 1 offsets; GPU
// families also get device copies and the longest sequence lengths (to size their grids).
struct AttentionShape {
  DType dtype = DType::kFloat32;
  int batch = 0;
  int64_t total_q = 0;
  int64_t total_k = 0;
  int num_heads = 0;
  int num_heads_k = 0;
  int head_dim = 0;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* cu_seqlens_q_device = nullptr;
  const int32_t* cu_seqlens_k_device = nullptr;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
};

struct ForwardParams {
  AttentionShape shape;
  AttentionOptions options;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
};

struct BackwardParams {
  AttentionShape shape;
  AttentionOptions options;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  bool deterministic = false;
};

// Where a kernel runs. The reference family uses num_threads host threads (0 = all cores).
// GPU families run on `stream` (a cudaStream_t) of the current device, with tensor pointers
// in device memory, and may use `workspace` (device scratch of workspace_bytes).
// compute_capability (major * 10 + minor) selects the code path a GPU family runs, so an
// older architecture's path (Turing flash, the fallback's sm70/sm75 paths) can be run and tested
// on a newer GPU; 0 = the current device's own. disabled_paths (kPath* bits) switches off a
// path within one architecture, so tests and benchmarks can run the next one down on the same
// device (flash's sm80 kernels on a Hopper GPU); 0 = every path where it is built and fits.
struct ExecutionContext {
  int num_threads = 0;
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int compute_capability = 0;
  // Polled by host families (the reference) between work items, from any of their threads:
  // true stops the launch with KernelStatus::Stopped(), so a request whose deadline passed or
  // whose caller left stops within one item's time instead of running to the end. Empty: never.
  std::function<bool()> should_stop;
  unsigned disabled_paths = 0;
};

// ExecutionContext::disabled_paths bits (the C ABI's ATTN_PATH_* have the same values).
inline constexpr unsigned kPathSm90Forward = 1u << 0;   // flash's wgmma forward: sm80 runs instead
inline constexpr unsigned kPathSm90Backward = 1u << 1;  // flash's wgmma dK/dV: sm80 runs instead

// Kernels report failure as a message; the engine turns it into absl::Status.
struct KernelStatus {
  bool ok = true;
  std::string message;
  bool stopped = false;  // ended early because ExecutionContext::should_stop said so
  static KernelStatus Ok() { return {}; }
  static KernelStatus Error(std::string msg) { return {false, std::move(msg)}; }
  static KernelStatus Stopped() { return {false, "stopped before it finished", true}; }
};

// Every kernel family exposes these two entry points with exactly this signature.
using ForwardFn = KernelStatus (*)(const ForwardParams&, const ExecutionContext&);
using BackwardFn = KernelStatus (*)(const BackwardParams&, const ExecutionContext&);

}  // namespace attnserve::kernels
