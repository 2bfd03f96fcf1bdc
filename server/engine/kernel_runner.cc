#include "server/engine/kernel_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/engine/group_launch.h"
#include "server/engine/sequence_groups.h"

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
  resolved.dropout_p = o.dropout_p;
  resolved.dropout_seed = o.dropout_seed;
  if (o.alibi_slopes) {
    // Validated float32 [num_heads] or [batch, num_heads]; std::string storage is aligned
    // for float.
    resolved.alibi_slopes = reinterpret_cast<const float*>(o.alibi_slopes->data.data());
    resolved.alibi_slopes_stride =
        o.alibi_slopes->shape.size() == 2 ? static_cast<int>(o.alibi_slopes->shape[1]) : 0;
  }
  return resolved;
}

char* OutputOf(const TensorView& like, char* destination, OwnedTensor& t) {
  t.dtype = like.dtype;
  t.shape = like.shape;
  if (destination != nullptr) return destination;
  t.data.resize(like.size_bytes);
  return t.data.data();
}

absl::Status KernelError(const KernelFamily& family, const kernels::KernelStatus& status) {
  if (status.stopped) {
    return absl::CancelledError(
        "stopped while it ran: its deadline passed or its caller cancelled");
  }
  return absl::InternalError(absl::StrCat("kernel family ", family.name, ": ", status.message));
}

TensorView RowsOfView(const TensorView& t, int64_t first, int64_t end) {
  const size_t row_bytes =
      static_cast<size_t>(t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype));
  TensorView rows = t;
  rows.shape[0] = end - first;
  rows.data = t.data + first * row_bytes;
  rows.size_bytes = (end - first) * row_bytes;
  return rows;
}

kernels::BackwardParams BackwardOfRows(const BackwardInputs& in,
                                       const kernels::AttentionShape& shape,
                                       const kernels::AttentionOptions& options, int64_t q0,
                                       int64_t q1, int64_t k0, int64_t k1,
                                       std::vector<float>& lse_scratch) {
  kernels::BackwardParams params;
  params.shape = shape;
  params.options = options;
  params.deterministic = in.deterministic;
  params.q = RowsOfView(in.q, q0, q1).data;
  params.k = RowsOfView(in.k, k0, k1).data;
  params.v = RowsOfView(in.v, k0, k1).data;
  params.out = RowsOfView(in.out, q0, q1).data;
  params.dout = RowsOfView(in.dout, q0, q1).data;
  // lse is [heads, total_q]: the rows are a column range of every head.
  const int64_t heads = in.q.shape[1], total_q = in.q.shape[0];
  const float* const lse = reinterpret_cast<const float*>(in.lse.data);
  lse_scratch.resize(static_cast<size_t>(heads * (q1 - q0)));
  for (int64_t h = 0; h < heads; ++h) {
    std::copy_n(lse + h * total_q + q0, q1 - q0, lse_scratch.data() + h * (q1 - q0));
  }
  params.lse = lse_scratch.data();
  return params;
}

std::vector<int32_t> Rebased(const std::vector<int32_t>& cu, int32_t first, int32_t end) {
  std::vector<int32_t> rebased(cu.begin() + first, cu.begin() + end + 1);
  for (int32_t& offset : rebased) offset -= cu[first];
  return rebased;
}

namespace {

// A forward whose inputs arrive by groups of sequences: each group runs as soon as it is in,
// as its own varlen launch (sequences are independent, so each row's result is the one the
// whole launch gives), writing its out rows and lse columns at their destinations.
absl::StatusOr<ForwardResult> RunForwardByGroups(const KernelFamily& family,
                                                 const ForwardInputs& in,
                                                 const kernels::ExecutionContext& ctx) {
  SequenceGroups& groups = *in.groups;
  const int64_t heads = in.q.shape[1], total_q = in.q.shape[0];
  const size_t q_row_bytes = in.q.size_bytes / std::max<int64_t>(1, total_q);
  ForwardResult result;
  result.out = {in.q.dtype, in.q.shape, ""};
  result.lse = {DType::kFloat32, {heads, total_q}, ""};
  float* const lse = reinterpret_cast<float*>(in.output_space.at(1));
  const GroupLaunches plan =
      PlanGroupLaunches(groups, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  std::vector<float> group_lse;
  absl::Duration compute;
  for (int g = 0; g < groups.count(); ++g) {
    if (absl::Status arrived = groups.WaitFor(g); !arrived.ok()) return arrived;
    const GroupLaunch& launch = plan.groups[g];
    const int64_t q0 = launch.q0, q1 = launch.q1, k0 = launch.k0;
    if (q1 > q0) {
      kernels::ForwardParams params;
      params.shape = launch.shape;
      params.options = ResolveOptions(in.options, params.shape.head_dim);
      params.options.first_sequence = launch.first_sequence;
      params.q = RowsOfView(in.q, q0, q1).data;
      params.k = RowsOfView(in.k, k0, launch.k1).data;
      params.v = RowsOfView(in.v, k0, launch.k1).data;
      params.out = in.output_space.at(0) + q0 * q_row_bytes;
      group_lse.resize(static_cast<size_t>(heads * (q1 - q0)));
      params.lse = group_lse.data();
      const absl::Time start = absl::Now();
      kernels::KernelStatus status = family.forward(params, ctx);
      compute += absl::Now() - start;
      if (!status.ok) return KernelError(family, status);
      // lse is [heads, total_q]: the group's rows are a column range of every head.
      for (int64_t h = 0; h < heads; ++h) {
        std::copy_n(group_lse.data() + h * (q1 - q0), q1 - q0, lse + h * total_q + q0);
      }
    }
    groups.Finished(g);
  }
  result.execution.kernel = family.name;
  result.execution.compute_us = absl::ToInt64Microseconds(compute);
  return result;
}

// A backward whose inputs arrive by groups of sequences: each group runs as its own varlen
// launch once it is in, into scratch, and its dq, dk, dv rows are then copied to their
// destinations: over the group's own rows of dout, k and v where they overlay them (which no
// later group reads: sequences are independent), else into the result's own bytes.
absl::StatusOr<BackwardResult> RunBackwardByGroups(const KernelFamily& family,
                                                   const BackwardInputs& in,
                                                   const kernels::ExecutionContext& ctx) {
  SequenceGroups& groups = *in.groups;
  const size_t q_row = in.q.size_bytes / std::max<int64_t>(1, in.q.shape[0]);
  const size_t k_row = in.k.size_bytes / std::max<int64_t>(1, in.k.shape[0]);
  BackwardResult result;
  char* const dq = OutputOf(in.q, in.output_space.at(0), result.dq);
  char* const dk = OutputOf(in.k, in.output_space.at(1), result.dk);
  char* const dv = OutputOf(in.v, in.output_space.at(2), result.dv);
  const GroupLaunches plan =
      PlanGroupLaunches(groups, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  std::vector<float> group_lse;
  std::string group_dq, group_dk, group_dv;
  absl::Duration compute;
  for (int g = 0; g < groups.count(); ++g) {
    if (absl::Status arrived = groups.WaitFor(g); !arrived.ok()) return arrived;
    const GroupLaunch& launch = plan.groups[g];
    const int64_t q0 = launch.q0, q1 = launch.q1, k0 = launch.k0, k1 = launch.k1;
    if (q1 > q0 || k1 > k0) {
      kernels::AttentionOptions options = ResolveOptions(in.options, launch.shape.head_dim);
      options.first_sequence = launch.first_sequence;
      kernels::BackwardParams params =
          BackwardOfRows(in, launch.shape, options, q0, q1, k0, k1, group_lse);
      group_dq.resize((q1 - q0) * q_row);
      group_dk.resize((k1 - k0) * k_row);
      group_dv.resize((k1 - k0) * k_row);
      params.dq = group_dq.data();
      params.dk = group_dk.data();
      params.dv = group_dv.data();
      const absl::Time start = absl::Now();
      kernels::KernelStatus status = family.backward(params, ctx);
      compute += absl::Now() - start;
      if (!status.ok) return KernelError(family, status);
      std::copy(group_dq.begin(), group_dq.end(), dq + q0 * q_row);
      std::copy(group_dk.begin(), group_dk.end(), dk + k0 * k_row);
      std::copy(group_dv.begin(), group_dv.end(), dv + k0 * k_row);
    }
    groups.Finished(g);
  }
  result.execution.kernel = family.name;
  result.execution.compute_us = absl::ToInt64Microseconds(compute);
  return result;
}

}  // namespace

absl::StatusOr<ForwardResult> RunForward(const KernelFamily& family, const ForwardInputs& in,
                                         const kernels::ExecutionContext& ctx) {
  if (in.groups != nullptr) {
    if (in.output_space.at(0) != nullptr && in.output_space.at(1) != nullptr) {
      return RunForwardByGroups(family, in, ctx);
    }
    // Without destinations for its outputs it runs whole, once everything is in.
    if (absl::Status arrived = in.groups->WaitForAll(); !arrived.ok()) return arrived;
  }
  kernels::ForwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  ForwardResult result;
  // out may overlay q: the host families (the reference) read each (row, head) of q before
  // they write out's, and never read it again.
  params.out = OutputOf(in.q, in.output_space.at(0), result.out);
  TensorView lse_like{DType::kFloat32, {params.shape.num_heads, params.shape.total_q}, nullptr,
                      sizeof(float) * params.shape.num_heads * params.shape.total_q};
  params.lse = reinterpret_cast<float*>(OutputOf(lse_like, in.output_space.at(1), result.lse));
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
  if (in.groups != nullptr) return RunBackwardByGroups(family, in, ctx);
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
  params.dq = OutputOf(in.q, destinations[0], result.dq);
  params.dk = OutputOf(in.k, destinations[1], result.dk);
  params.dv = OutputOf(in.v, destinations[2], result.dv);
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
