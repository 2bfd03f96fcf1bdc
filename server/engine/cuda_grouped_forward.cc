#include "server/engine/cuda_grouped_forward.h"

#include <algorithm>
#include <vector>

#include "server/engine/kernel_launch_status.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {

absl::StatusOr<LaneRun> RunForwardLaunches(const kernels::KernelFamilyEntry& family,
                                           const ForwardLaunchSet& set,
                                           const GroupLaunches& plan, const LaunchHooks& hooks,
                                           CudaLane& lane, const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep) {
  const int64_t heads = set.q.shape[1], total_q = set.q.shape[0];
  const size_t q_row = RowBytesOf(set.q), k_row = RowBytesOf(set.k), lse_row = sizeof(float);
  const kernels::AttentionOptions options = ResolveOptions(set.options, set.q.shape[2]);
  size_t kernel_workspace = 0, lse_scratch = 0;
  for (const GroupLaunch& launch : plan.groups) {
    kernels::ForwardParams params;
    params.shape = launch.shape;
    params.options = LaunchOptions(options, launch);
    kernel_workspace = std::max(kernel_workspace, family.forward_workspace_bytes(params));
    lse_scratch =
        std::max(lse_scratch, static_cast<size_t>(heads * (launch.q1 - launch.q0)) * lse_row);
  }
  // Workspace: [a launch's lse, [heads, rows] as it writes it | the kernel's own].
  const size_t scratch_bytes = AlignedScratch(lse_scratch);
  const auto whole = [](size_t bytes) { return ByteRange{0, bytes}; };
  const size_t cu_q_bytes = set.cu_seqlens_q->size() * sizeof(int32_t);
  const size_t cu_k_bytes = set.cu_seqlens_k->size() * sizeof(int32_t);

  // A resident request's q, k and v are read where they lie: only the offsets cross.
  const bool resident = set.resident[0] != nullptr;
  const size_t offsets_input = resident ? 2 : 5;
  const int count = static_cast<int>(plan.groups.size());
  std::vector<LaneStep> steps(count);
  // Key rows already sent: blocks of one sequence's rows share its first keys.
  int64_t keys_sent = 0;
  for (int g = 0; g < count; ++g) {
    const GroupLaunch& group = plan.groups[g];
    const int64_t rows = group.q1 - group.q0;
    const int64_t k_from = std::max(group.k0, std::min(group.k1, keys_sent));
    keys_sent = std::max(keys_sent, group.k1);
    LaneStep& step = steps[g];
    if (hooks.ready) step.ready = [&hooks, g] { return hooks.ready(g); };
    step.before_launch = hooks.before_launch;
    // The offsets (the whole forward's too, for a kept context) cross with the first launch.
    step.inputs = {g == 0 ? whole(cu_q_bytes) : ByteRange{},
                   g == 0 ? whole(cu_k_bytes) : ByteRange{},
                   g == 0 ? whole(plan.offsets_bytes()) : ByteRange{}};
    if (!resident) {
      step.inputs.insert(step.inputs.begin(), {{group.q0 * q_row, group.q1 * q_row},
                                               {k_from * k_row, group.k1 * k_row},
                                               {k_from * k_row, group.k1 * k_row}});
    }
    step.launch = [&, launch = &group, rows](const DeviceBuffers& d,
                                             cudaStream_t stream) -> absl::Status {
      if (rows == 0) return absl::OkStatus();
      kernels::ForwardParams params;
      params.shape = launch->shape;
      params.options = LaunchOptions(options, *launch);
      const char* const q = resident ? set.resident[0] : d.inputs[0];
      const char* const k = resident ? set.resident[1] : d.inputs[1];
      const char* const v = resident ? set.resident[2] : d.inputs[2];
      params.q = q + launch->q0 * q_row;
      params.k = k + launch->k0 * k_row;
      params.v = v + launch->k0 * k_row;
      const int32_t* offsets = reinterpret_cast<const int32_t*>(d.inputs[offsets_input]);
      params.shape.cu_seqlens_q_device = offsets + launch->cu_q_at;
      params.shape.cu_seqlens_k_device = offsets + launch->cu_k_at;
      params.out = d.outputs[0] + launch->q0 * q_row;
      params.lse = reinterpret_cast<float*>(d.workspace);
      void* workspace = kernel_workspace > 0 ? d.workspace + scratch_bytes : nullptr;
      const kernels::KernelStatus status =
          family.forward(params, device_context(stream, workspace, kernel_workspace));
      if (absl::Status launched = KernelLaunchStatus(family, "forward", status); !launched.ok()) {
        return launched;
      }
      // The launch's lse columns of every head, where the whole forward's launch writes them.
      return CudaStatus(cudaMemcpy2DAsync(d.outputs[1] + launch->q0 * lse_row, total_q * lse_row,
                                          d.workspace, rows * lse_row, rows * lse_row, heads,
                                          cudaMemcpyDeviceToDevice, stream),
                        "cudaMemcpy2DAsync (a launch's lse)");
    };
    step.outputs = {
        {group.q0 * q_row, rows * q_row, 1, 0},
        {group.q0 * lse_row, rows * lse_row, static_cast<size_t>(heads), total_q * lse_row}};
    if (hooks.done) step.done = [&hooks, g] { hooks.done(g); };
  }
  std::vector<GatheredInput> inputs = {{{set.cu_seqlens_q->data(), cu_q_bytes}},
                                       {{set.cu_seqlens_k->data(), cu_k_bytes}},
                                       {{plan.offsets.data(), plan.offsets_bytes()}}};
  if (!resident) inputs.insert(inputs.begin(), {set.q_data, set.k_data, set.v_data});
  return lane.RunSteps(
      inputs,
      {static_cast<size_t>(total_q) * q_row, static_cast<size_t>(heads * total_q) * lse_row},
      scratch_bytes + kernel_workspace, steps, keep, set.destinations);
}

LaunchHooks ArrivalHooks(SequenceGroups& groups, const std::vector<int>& group_of,
                         std::function<absl::Status()> before_launch) {
  LaunchHooks hooks;
  hooks.ready = [&groups, &group_of](int i) {
    if (i > 0 && group_of[i - 1] == group_of[i]) return absl::OkStatus();
    return groups.WaitFor(group_of[i]);
  };
  hooks.done = [&groups, &group_of](int i) {
    const size_t next = static_cast<size_t>(i) + 1;
    if (next < group_of.size() && group_of[next] == group_of[i]) return;
    groups.Finished(group_of[i]);
  };
  hooks.before_launch = std::move(before_launch);
  return hooks;
}

absl::StatusOr<LaneRun> RunForwardInGroups(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep,
                                           const GroupCut& cut) {
  SequenceGroups& groups = *in.groups;
  const GroupPieces pieces = CutGroups(groups, cut.cut);
  if (cut.launches != nullptr) *cut.launches = pieces.ranges.size();
  const GroupLaunches plan =
      PlanSplitLaunches(pieces.ranges, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  ForwardLaunchSet set;
  set.q = in.q;
  set.k = in.k;
  set.q_data = {{in.q.data, in.q.size_bytes}};
  set.k_data = {{in.k.data, in.k.size_bytes}};
  set.v_data = {{in.v.data, in.v.size_bytes}};
  set.cu_seqlens_q = &in.cu_seqlens_q;
  set.cu_seqlens_k = &in.cu_seqlens_k;
  set.options = in.options;
  set.destinations = in.output_space.destinations;
  const LaunchHooks hooks = ArrivalHooks(groups, pieces.group_of, cut.before_launch);
  return RunForwardLaunches(family, set, plan, hooks, lane, device_context, keep);
}

}  // namespace attnserve::engine
