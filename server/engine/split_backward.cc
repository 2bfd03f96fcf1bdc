#include "server/engine/split_backward.h"

#include <algorithm>
#include <string>

#include "absl/time/clock.h"
#include "kernels/reference/tensor_io.h"
#include "server/engine/group_launch.h"

namespace attnserve::engine {
namespace {

// Elements per accumulate/store call: a bounded float row buffer, whatever the tensor's size.
constexpr int kChunk = 4096;

}  // namespace

void AccumulatePartial(kernels::DType dtype, const char* partial, int64_t elements,
                       float* accumulator) {
  float row[kChunk];
  for (int64_t at = 0; at < elements; at += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, elements - at));
    kernels::reference::LoadRow(dtype, partial, at, n, row);
    for (int i = 0; i < n; ++i) accumulator[at + i] += row[i];
  }
}

void StoreAccumulated(kernels::DType dtype, const float* accumulator, int64_t elements,
                      char* out) {
  for (int64_t at = 0; at < elements; at += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, elements - at));
    kernels::reference::StoreRow(dtype, accumulator + at, n, out, at);
  }
}

absl::StatusOr<BackwardResult> RunBackwardInLaunches(
    const KernelFamily& family, const BackwardInputs& in, const std::vector<LaunchRange>& ranges,
    const kernels::ExecutionContext& ctx, const std::function<absl::Status()>& before_launch) {
  const size_t q_row = RowBytesOf(in.q), k_row = RowBytesOf(in.k);
  const int64_t k_row_elements = in.k.shape[1] * in.k.shape[2];
  BackwardResult result;
  // Each launch writes into its own scratch first and its rows are copied out after it: an
  // output may overlay an input (dq on dout, dk on k, dv on v), and a launch reads its inputs
  // after writing some of its outputs, while later launches read only other rows (or, for a
  // sequence's blocks, keys whose dk and dv are written after its last block).
  char* const dq = OutputOf(in.q, in.output_space.at(0), result.dq);
  char* const dk = OutputOf(in.k, in.output_space.at(1), result.dk);
  char* const dv = OutputOf(in.v, in.output_space.at(2), result.dv);
  const GroupLaunches plan =
      PlanSplitLaunches(ranges, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  const kernels::AttentionOptions options =
      ResolveOptions(in.options, static_cast<int>(in.q.shape[2]));
  std::vector<float> launch_lse, dk_sum, dv_sum;
  std::string launch_dq, launch_dk, launch_dv;
  absl::Duration compute;
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    if (before_launch) {
      if (absl::Status s = before_launch(); !s.ok()) return s;
    }
    const GroupLaunch& launch = plan.groups[i];
    const int64_t q0 = launch.q0, q1 = launch.q1, k0 = launch.k0, k1 = launch.k1;
    const int64_t sequence_elements = (launch.seq_k1 - k0) * k_row_elements;
    if (launch.row_block && launch.first_block) {
      // A sequence's first block: its sums start at zero.
      dk_sum.assign(static_cast<size_t>(sequence_elements), 0.0f);
      dv_sum.assign(dk_sum.size(), 0.0f);
    }
    launch_dq.assign((q1 - q0) * q_row, '\0');
    launch_dk.assign((k1 - k0) * k_row, '\0');
    launch_dv.assign((k1 - k0) * k_row, '\0');
    if (q1 > q0 || k1 > k0) {
      kernels::BackwardParams params = BackwardOfRows(
          in, launch.shape, LaunchOptions(options, launch), q0, q1, k0, k1, launch_lse);
      params.dq = launch_dq.data();
      params.dk = launch_dk.data();
      params.dv = launch_dv.data();
      const absl::Time start = absl::Now();
      const kernels::KernelStatus status = family.backward(params, ctx);
      compute += absl::Now() - start;
      if (!status.ok) return KernelError(family, status);
    }
    std::copy(launch_dq.begin(), launch_dq.end(), dq + q0 * q_row);
    if (!launch.row_block) {
      std::copy(launch_dk.begin(), launch_dk.end(), dk + k0 * k_row);
      std::copy(launch_dv.begin(), launch_dv.end(), dv + k0 * k_row);
      continue;
    }
    // Keys [0, key_end) of the sequence get this block's share; later keys none.
    AccumulatePartial(in.k.dtype, launch_dk.data(), (k1 - k0) * k_row_elements, dk_sum.data());
    AccumulatePartial(in.k.dtype, launch_dv.data(), (k1 - k0) * k_row_elements, dv_sum.data());
    if (launch.last_block) {
      StoreAccumulated(in.k.dtype, dk_sum.data(), sequence_elements, dk + k0 * k_row);
      StoreAccumulated(in.k.dtype, dv_sum.data(), sequence_elements, dv + k0 * k_row);
    }
  }
  result.execution.kernel = family.name;
  result.execution.compute_us = absl::ToInt64Microseconds(compute);
  return result;
}

}  // namespace attnserve::engine
