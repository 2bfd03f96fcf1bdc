#include "server/engine/cuda_grouped_backward.h"

#include <algorithm>
#include <array>
#include <vector>

#include "kernels/gradient_sum/gradient_sum.h"

#include "server/engine/group_launch.h"
#include "server/engine/kernel_launch_status.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {
namespace {

// Where the launch reads dout, q, k, v, out and lse ([heads, total_q]) from: the run's
// inputs, the context's device memory, or a resident request's own device tensors.
struct Sources {
  const char *dout, *q, *k, *v, *out, *lse;
};

Sources SourcesOf(const DeviceBuffers& d, const ContextMemory* context,
                  const std::array<const char*, 6>& resident) {
  if (resident[0] != nullptr) {
    return {resident[0], resident[1], resident[2], resident[3], resident[4], resident[5]};
  }
  if (context == nullptr) {
    return {d.inputs[0], d.inputs[1], d.inputs[2], d.inputs[3], d.inputs[4], d.inputs[5]};
  }
  return {d.inputs[0], context->address(ContextTensor::kQ), context->address(ContextTensor::kK),
          context->address(ContextTensor::kV), context->address(ContextTensor::kOut),
          context->address(ContextTensor::kLse)};
}

// Adds a row block's partial dk and dv (`elements` each, the sequence's keys [0, key_end))
// into the float32 sums; with `outputs` set (its sequence's last block), writes the sums of all
// `sum_elements` there in `dtype`.
absl::Status SumBlock(kernels::DType dtype, std::array<const char*, 2> partials,
                      int64_t elements, std::array<float*, 2> sums,
                      std::array<char*, 2> outputs, int64_t sum_elements,
                      cudaStream_t stream) {
  for (int i = 0; i < 2; ++i) {
    if (absl::Status s = CudaStatus(kernels::gradient_sum::Accumulate(dtype, partials[i],
                                                                      elements, sums[i], stream),
                                    "gradient_sum::Accumulate (a row block's dk and dv)");
        !s.ok()) {
      return s;
    }
    if (outputs[i] == nullptr) continue;
    if (absl::Status s = CudaStatus(
            kernels::gradient_sum::Store(dtype, sums[i], sum_elements, outputs[i], stream),
            "gradient_sum::Store (a split sequence's dk and dv)");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaneRun> RunBackwardLaunches(const kernels::KernelFamilyEntry& family,
                                            const BackwardLaunchSet& set,
                                            const GroupLaunches& plan, const LaunchHooks& hooks,
                                            CudaLane& lane, const DeviceContextFn& device_context,
                                            const ContextMemory* context) {
  const int64_t heads = set.q.shape[1], total_q = set.q.shape[0], total_k = set.k.shape[0];
  const size_t q_row = RowBytesOf(set.q), k_row = RowBytesOf(set.k), lse_row = sizeof(float);
  const int64_t k_row_elements = set.k.shape[1] * set.k.shape[2];
  const size_t lse_bytes = static_cast<size_t>(heads * total_q) * lse_row;
  const kernels::AttentionOptions options = ResolveOptions(set.options, set.q.shape[2]);
  size_t kernel_workspace = 0, lse_scratch = 0, partial_bytes = 0, sum_bytes = 0;
  for (const GroupLaunch& launch : plan.groups) {
    kernels::BackwardParams params;
    params.shape = launch.shape;
    params.options = LaunchOptions(options, launch);
    params.deterministic = set.deterministic;
    kernel_workspace =
        std::max(kernel_workspace, family.backward_workspace_bytes(params, set.code_path));
    lse_scratch =
        std::max(lse_scratch, static_cast<size_t>(heads * (launch.q1 - launch.q0)) * lse_row);
    if (launch.row_block) {
      partial_bytes = std::max(partial_bytes, static_cast<size_t>(launch.k1 - launch.k0) * k_row);
      sum_bytes = std::max(sum_bytes, static_cast<size_t>((launch.seq_k1 - launch.k0) *
                                                          k_row_elements) * sizeof(float));
    }
  }
  // Workspace: [the launch's lse, [heads, rows] as it reads it | a row block's partial dk |
  // its partial dv | the float32 sums of its sequence's dk | of its dv | the kernel's own].
  // The sums live across the steps of one sequence's blocks (one stream, one workspace).
  const size_t partial_at = AlignedScratch(lse_scratch);
  const size_t sums_at = partial_at + 2 * AlignedScratch(partial_bytes);
  const size_t scratch_bytes = sums_at + 2 * AlignedScratch(sum_bytes);
  // Inputs: dout, then (when they travel) q, k, v, out, lse, none of them for a resident
  // request; the launches' offsets last.
  std::vector<GatheredInput> inputs = set.tensors;
  const size_t offsets_input = inputs.size();
  inputs.push_back({{plan.offsets.data(), plan.offsets_bytes()}});

  const int count = static_cast<int>(plan.groups.size());
  std::vector<LaneStep> steps(count);
  // Key rows already sent: blocks of one sequence's rows share its first keys.
  int64_t keys_sent = 0;
  for (int g = 0; g < count; ++g) {
    const GroupLaunch& group = plan.groups[g];
    const int64_t q_rows = group.q1 - group.q0, k_rows = group.k1 - group.k0;
    const int64_t k_from = std::max(group.k0, std::min(group.k1, keys_sent));
    keys_sent = std::max(keys_sent, group.k1);
    LaneStep& step = steps[g];
    if (hooks.ready) step.ready = [&hooks, g] { return hooks.ready(g); };
    step.before_launch = hooks.before_launch;
    const ByteRange query_rows{group.q0 * q_row, group.q1 * q_row};
    const ByteRange key_rows{k_from * k_row, group.k1 * k_row};
    const auto with_first = [g](size_t bytes) { return g == 0 ? ByteRange{0, bytes} : ByteRange{}; };
    const bool resident = set.resident[0] != nullptr;
    if (!resident) step.inputs = {query_rows};
    if (context == nullptr && !resident) {
      step.inputs.insert(step.inputs.end(),
                         {query_rows, key_rows, key_rows, query_rows, with_first(lse_bytes)});
    }
    step.inputs.push_back(with_first(plan.offsets_bytes()));
    step.launch = [&, launch = &group, q_rows, k_rows](const DeviceBuffers& d,
                                                       cudaStream_t stream) -> absl::Status {
      // A row block's dk and dv go to scratch and are summed; a group's to its output rows.
      const bool block = launch->row_block;
      char* const partial_dk = d.workspace + partial_at;
      char* const partial_dv = partial_dk + AlignedScratch(partial_bytes);
      float* const dk_sum = reinterpret_cast<float*>(d.workspace + sums_at);
      float* const dv_sum = reinterpret_cast<float*>(d.workspace + sums_at +
                                                     AlignedScratch(sum_bytes));
      const int64_t sum_elements = (launch->seq_k1 - launch->k0) * k_row_elements;
      char* const dq = d.outputs[0] + launch->q0 * q_row;
      char* const dk = block ? partial_dk : d.outputs[1] + launch->k0 * k_row;
      char* const dv = block ? partial_dv : d.outputs[2] + launch->k0 * k_row;
      if (block && launch->first_block) {
        for (float* sum : {dk_sum, dv_sum}) {
          if (absl::Status s = CudaStatus(
                  cudaMemsetAsync(sum, 0, sum_elements * sizeof(float), stream),
                  "cudaMemsetAsync (a split backward's dk and dv sums)");
              !s.ok()) {
            return s;
          }
        }
      }
      if (q_rows == 0 || k_rows == 0) {
        // No query attends to a key of this launch: every gradient of it is zero.
        for (auto [at, bytes] : {std::pair{dq, q_rows * q_row}, std::pair{dk, k_rows * k_row},
                                 std::pair{dv, k_rows * k_row}}) {
          if (bytes == 0) continue;
          if (absl::Status s = CudaStatus(cudaMemsetAsync(at, 0, bytes, stream), "cudaMemsetAsync");
              !s.ok()) {
            return s;
          }
        }
      } else {
        const Sources from = SourcesOf(d, context, set.resident);
        float* const lse = reinterpret_cast<float*>(d.workspace);
        // The launch's lse columns of every head, [heads, rows] as its own launch reads them.
        if (absl::Status s = CudaStatus(
                cudaMemcpy2DAsync(lse, q_rows * lse_row, from.lse + launch->q0 * lse_row,
                                  total_q * lse_row, q_rows * lse_row, heads,
                                  cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpy2DAsync (a launch's lse)");
            !s.ok()) {
          return s;
        }
        kernels::BackwardParams params;
        params.shape = launch->shape;
        params.options = LaunchOptions(options, *launch);
        params.deterministic = set.deterministic;
        params.dout = from.dout + launch->q0 * q_row;
        params.q = from.q + launch->q0 * q_row;
        params.k = from.k + launch->k0 * k_row;
        params.v = from.v + launch->k0 * k_row;
        params.out = from.out + launch->q0 * q_row;
        params.lse = lse;
        const int32_t* offsets = reinterpret_cast<const int32_t*>(d.inputs[offsets_input]);
        params.shape.cu_seqlens_q_device = offsets + launch->cu_q_at;
        params.shape.cu_seqlens_k_device = offsets + launch->cu_k_at;
        params.dq = dq;
        params.dk = dk;
        params.dv = dv;
        void* workspace = kernel_workspace > 0 ? d.workspace + scratch_bytes : nullptr;
        const kernels::KernelStatus status =
            family.backward(params, device_context(stream, workspace, kernel_workspace));
        if (absl::Status s = KernelLaunchStatus(family, "backward", status); !s.ok()) return s;
      }
      if (!block) return absl::OkStatus();
      return SumBlock(set.k.dtype, {partial_dk, partial_dv}, k_rows * k_row_elements,
                      {dk_sum, dv_sum},
                      launch->last_block
                          ? std::array<char*, 2>{d.outputs[1] + launch->k0 * k_row,
                                                 d.outputs[2] + launch->k0 * k_row}
                          : std::array<char*, 2>{nullptr, nullptr},
                      sum_elements, stream);
    };
    // A row block's dq rows come back after it; its sequence's dk and dv after its last one.
    const int64_t dkv_rows =
        !group.row_block ? k_rows : (group.last_block ? group.seq_k1 - group.k0 : 0);
    step.outputs = {{group.q0 * q_row, q_rows * q_row, 1, 0},
                    {group.k0 * k_row, dkv_rows * k_row, 1, 0},
                    {group.k0 * k_row, dkv_rows * k_row, 1, 0}};
    if (hooks.done) step.done = [&hooks, g] { hooks.done(g); };
  }
  const size_t q_bytes = static_cast<size_t>(total_q) * q_row;
  const size_t k_bytes = static_cast<size_t>(total_k) * k_row;
  return lane.RunSteps(inputs, {q_bytes, k_bytes, k_bytes}, scratch_bytes + kernel_workspace,
                       steps, /*keep=*/nullptr, set.destinations);
}

absl::StatusOr<LaneRun> RunBackwardInGroups(const kernels::KernelFamilyEntry& family,
                                            const BackwardInputs& in, CudaLane& lane,
                                            const DeviceContextFn& device_context,
                                            const ContextMemory* context,
                                            const GroupCut& cut) {
  SequenceGroups& groups = *in.groups;
  const GroupPieces pieces = CutGroups(groups, cut.cut);
  if (cut.launches != nullptr) *cut.launches = pieces.ranges.size();
  const GroupLaunches plan =
      PlanSplitLaunches(pieces.ranges, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  BackwardLaunchSet set;
  set.q = in.q;
  set.k = in.k;
  set.tensors = {{{in.dout.data, in.dout.size_bytes}}};
  if (context == nullptr) {
    for (const TensorView* t : {&in.q, &in.k, &in.v, &in.out, &in.lse}) {
      set.tensors.push_back({{t->data, t->size_bytes}});
    }
  }
  set.cu_seqlens_q = &in.cu_seqlens_q;
  set.cu_seqlens_k = &in.cu_seqlens_k;
  set.options = in.options;
  set.deterministic = in.deterministic;
  set.code_path = in.route.code_path;
  set.destinations = in.output_space.destinations;
  const LaunchHooks hooks = ArrivalHooks(groups, pieces.group_of, cut.before_launch);
  return RunBackwardLaunches(family, set, plan, hooks, lane, device_context, context);
}

}  // namespace attnserve::engine
