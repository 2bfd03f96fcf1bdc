#include "server/engine/kernel_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnserve::engine {
namespace {

int MaxLength(const std::vector<int32_t>& cu) {
  int longest = 0;
  for (size_t i = 1; i < cu.size(); ++i) longest = std::max(longest, cu[i] - cu[i - 1]);
  return longest;
}

}  // namespace

kernels::AttentionShape ShapeOf(const TensorView& q, const TensorView& k,
                                const std::vector<int32_t>& cu_q,
                                const std::vector<int32_t>& cu_k) {
  kernels::AttentionShape shape;
  shape.dtype = q.dtype;
  shape.batch = static_cast<int>(cu_q.size()) - 1;
  shape.total_q = q.shape[0];
  shape.total_k = k.shape[0];
  shape.num_heads = static_cast<int>(q.shape[1]);
  shape.num_heads_k = static_cast<int>(k.shape[1]);
  shape.head_dim = static_cast<int>(q.shape[2]);
  shape.cu_seqlens_q = cu_q.data();
  shape.cu_seqlens_k = cu_k.data();
  shape.max_seqlen_q = MaxLength(cu_q);
  shape.max_seqlen_k = MaxLength(cu_k);
  return shape;
}

kernels::AttentionOptions ResolveOptions(const RequestOptions& o, int head_dim) {
  kernels::AttentionOptions resolved;
  resolved.softmax_scale =
      o.softmax_scale != 0.0f ? o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  resolved.causal = o.causal;
  resolved.window_left = o.window_left.value_or(-1);
  resolved.window_right = o.window_right.value_or(-1);
  resolved.softcap = o.softcap;
  return resolved;
}

namespace {

// A result tensor shaped like `like`, and where its bytes go: `destination` when given (the
// tensor then owns none), else its own bytes.
char* Output(const TensorView& like, char* destination, OwnedTensor& t) {
  t.dtype = like.dtype;
  t.shape = like.shape;
  if (destination != nullptr) return destination;
  t.data.resize(like.size_bytes);
  return t.data.data();
}

absl::Status KernelError(const KernelFamily& family, const kernels::KernelStatus& status) {
  return absl::InternalError(absl::StrCat("kernel family ", family.name, ": ", status.message));
}

}  // namespace

absl::StatusOr<ForwardResult> RunForward(const KernelFamily& family, const ForwardInputs& in,
                                         const kernels::ExecutionContext& ctx) {
  kernels::ForwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  ForwardResult result;
  // out may overlay q: the host families (the reference) read each (row, head) of q before
  // they write out's, and never read it again.
  params.out = Output(in.q, in.output_space.at(0), result.out);
  TensorView lse_like{DType::kFloat32, {params.shape.num_heads, params.shape.total_q}, nullptr,
                      sizeof(float) * params.shape.num_heads * params.shape.total_q};
  params.lse = reinterpret_cast<float*>(Output(lse_like, in.output_space.at(1), result.lse));
  params.q = in.q.data;
  params.k = in.k.data;
  params.v = in.v.data;
  const absl::Time start = absl::Now();
  kernels::KernelStatus status = family.forward(params, ctx);
  if (!status.ok) return KernelError(family, status);
  result.execution.kernel = family.name;
  result.execution.compute_us = absl::ToInt64Microseconds(absl::Now() - start);
  return result;
}

absl::StatusOr<BackwardResult> RunBackward(const KernelFamily& family, const BackwardInputs& in,
                                           const kernels::ExecutionContext& ctx) {
  kernels::BackwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  params.deterministic = in.deterministic;
  BackwardResult result;
  // Overlays are ignored here: the reference reads dout, k and v again after it wrote some dq,
  // dk and dv.
  const TensorView* overlaid[] = {&in.dout, &in.k, &in.v};
  char* destinations[3];
  for (size_t i = 0; i < 3; ++i) {
    char* d = in.output_space.at(i);
    destinations[i] = d == overlaid[i]->data ? nullptr : d;
  }
  params.dq = Output(in.q, destinations[0], result.dq);
  params.dk = Output(in.k, destinations[1], result.dk);
  params.dv = Output(in.v, destinations[2], result.dv);
  params.q = in.q.data;
  params.k = in.k.data;
  params.v = in.v.data;
  params.out = in.out.data;
  params.dout = in.dout.data;
  params.lse = reinterpret_cast<const float*>(in.lse.data);
  const absl::Time start = absl::Now();
  kernels::KernelStatus status = family.backward(params, ctx);
  if (!status.ok) return KernelError(family, status);
  result.execution.kernel = family.name;
  result.execution.compute_us = absl::ToInt64Microseconds(absl::Now() - start);
  return result;
}

}  // namespace attnserve::engine
