// Turns a validated engine request into the kernels' plain parameter struct, allocates the
// outputs and runs one kernel family's entry point. The only place engine types meet kernels/.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/attention_params.h"
#include "server/engine/attention_request.h"

namespace attnserve::engine {

// One kernel family's entry points, e.g. {"reference", reference::Forward, reference::Backward}.
struct KernelFamily {
  const char* name;
  kernels::ForwardFn forward;
  kernels::BackwardFn backward;
};

// The kernels' shape of a validated request (host offsets; GPU callers add device copies).
kernels::AttentionShape ShapeOf(const TensorView& q, const TensorView& k,
                                const std::vector<int32_t>& cu_q,
                                const std::vector<int32_t>& cu_k);

// The wire's conventions resolved for kernels: scale 0 means 1/sqrt(head_dim), absent window
// means -1 (unbounded).
kernels::AttentionOptions ResolveOptions(const RequestOptions& options, int head_dim);

// Rows [first, end) of a packed [rows, heads, head_dim] tensor.
TensorView RowsOfView(const TensorView& t, int64_t first, int64_t end);
// The backward of rows [q0, q1) of q, out and dout and [k0, k1) of k and v of `in`, with this
// shape and these options: lse's columns of those rows are copied into `lse_scratch` (lse is
// [heads, total_q]); dq, dk and dv are left for the caller to point at its scratch.
kernels::BackwardParams BackwardOfRows(const BackwardInputs& in,
                                       const kernels::AttentionShape& shape,
                                       const kernels::AttentionOptions& options, int64_t q0,
                                       int64_t q1, int64_t k0, int64_t k1,
                                       std::vector<float>& lse_scratch);
// Offsets of sequences [first, end) counted from the first one's start (end - first + 1 of them).
std::vector<int32_t> Rebased(const std::vector<int32_t>& cu, int32_t first, int32_t end);

// A result tensor shaped like `like`, and where its bytes go: `destination` when given (the
// tensor then owns none), else its own bytes.
char* OutputOf(const TensorView& like, char* destination, OwnedTensor& t);
// A family's failed status as the engine reports it (CANCELLED when it stopped part way).
absl::Status KernelError(const KernelFamily& family, const kernels::KernelStatus& status);

// Run on the host: inputs must have passed ValidateForward / ValidateBackward. They set
// execution.kernel and execution.compute_us (wall time of the kernel call).
absl::StatusOr<ForwardResult> RunForward(const KernelFamily& family, const ForwardInputs& inputs,
                                         const kernels::ExecutionContext& ctx);
absl::StatusOr<BackwardResult> RunBackward(const KernelFamily& family,
                                           const BackwardInputs& inputs,
                                           const kernels::ExecutionContext& ctx);

}  // namespace attnserve::engine
