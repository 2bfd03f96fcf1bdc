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

OwnedTensor AllocateLike(const TensorView& like) {
  OwnedTensor t;
  t.dtype = like.dtype;
  t.shape = like.shape;
  t.data.resize(like.size_bytes);
  return t;
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
  result.out = AllocateLike(in.q);
  result.lse.dtype = DType::kFloat32;
  result.lse.shape = {params.shape.num_heads, params.shape.total_q};
  result.lse.data.resize(sizeof(float) * params.shape.num_heads * params.shape.total_q);
  params.q = in.q.data;
  params.k = in.k.data;
  params.v = in.v.data;
  params.out = result.out.data.data();
  params.lse = reinterpret_cast<float*>(result.lse.data.data());
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
  result.dq = AllocateLike(in.q);
  result.dk = AllocateLike(in.k);
  result.dv = AllocateLike(in.v);
  params.q = in.q.data;
  params.k = in.k.data;
  params.v = in.v.data;
  params.out = in.out.data;
  params.dout = in.dout.data;
  params.lse = reinterpret_cast<const float*>(in.lse.data);
  params.dq = result.dq.data.data();
  params.dk = result.dk.data.data();
  params.dv = result.dv.data.data();
  const absl::Time start = absl::Now();
  kernels::KernelStatus status = family.backward(params, ctx);
  if (!status.ok) return KernelError(family, status);
  result.execution.kernel = family.name;
  result.execution.compute_us = absl::ToInt64Microseconds(absl::Now() - start);
  return result;
}

}  // namespace attnserve::engine
