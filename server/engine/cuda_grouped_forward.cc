#include "server/engine/cuda_grouped_forward.h"

#include <algorithm>
#include <vector>

#include "server/engine/group_launch.h"
#include "server/engine/kernel_launch_status.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {

absl::StatusOr<LaneRun> RunForwardInGroups(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep) {
  SequenceGroups& groups = *in.groups;
  const int64_t heads = in.q.shape[1], total_q = in.q.shape[0];
  const size_t q_row = RowBytesOf(in.q), k_row = RowBytesOf(in.k), lse_row = sizeof(float);
  const GroupLaunches plan =
      PlanGroupLaunches(groups, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  const kernels::AttentionOptions options = ResolveOptions(in.options, in.q.shape[2]);
  size_t kernel_workspace = 0, lse_scratch = 0;
  for (const GroupLaunch& launch : plan.groups) {
    kernels::ForwardParams params;
    params.shape = launch.shape;
    params.options = options;
    kernel_workspace = std::max(kernel_workspace, family.forward_workspace_bytes(params));
    lse_scratch =
        std::max(lse_scratch, static_cast<size_t>(heads * (launch.q1 - launch.q0)) * lse_row);
  }
  // Workspace: [a group's lse, [heads, rows] as its launch writes it | the kernel's own].
  const size_t scratch_bytes = AlignedScratch(lse_scratch);
  const auto whole = [](size_t bytes) { return ByteRange{0, bytes}; };
  const size_t cu_q_bytes = in.cu_seqlens_q.size() * sizeof(int32_t);
  const size_t cu_k_bytes = in.cu_seqlens_k.size() * sizeof(int32_t);

  std::vector<LaneStep> steps(groups.count());
  for (int g = 0; g < groups.count(); ++g) {
    const GroupLaunch& group = plan.groups[g];
    const int64_t rows = group.q1 - group.q0;
    LaneStep& step = steps[g];
    step.ready = [&groups, g] { return groups.WaitFor(g); };
    // The offsets (the whole forward's too, for a kept context) cross with the first group.
    step.inputs = {{group.q0 * q_row, group.q1 * q_row},
                   {group.k0 * k_row, group.k1 * k_row},
                   {group.k0 * k_row, group.k1 * k_row},
                   g == 0 ? whole(cu_q_bytes) : ByteRange{},
                   g == 0 ? whole(cu_k_bytes) : ByteRange{},
                   g == 0 ? whole(plan.offsets_bytes()) : ByteRange{}};
    step.launch = [&, launch = &group, rows](const DeviceBuffers& d,
                                             cudaStream_t stream) -> absl::Status {
      if (rows == 0) return absl::OkStatus();
      kernels::ForwardParams params;
      params.shape = launch->shape;
      params.options = options;
      params.options.first_sequence = launch->first_sequence;
      params.q = d.inputs[0] + launch->q0 * q_row;
      params.k = d.inputs[1] + launch->k0 * k_row;
      params.v = d.inputs[2] + launch->k0 * k_row;
      const int32_t* offsets = reinterpret_cast<const int32_t*>(d.inputs[5]);
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
      // The group's lse columns of every head, where the whole forward's launch writes them.
      return CudaStatus(cudaMemcpy2DAsync(d.outputs[1] + launch->q0 * lse_row, total_q * lse_row,
                                          d.workspace, rows * lse_row, rows * lse_row, heads,
                                          cudaMemcpyDeviceToDevice, stream),
                        "cudaMemcpy2DAsync (a group's lse)");
    };
    step.outputs = {
        {group.q0 * q_row, rows * q_row, 1, 0},
        {group.q0 * lse_row, rows * lse_row, static_cast<size_t>(heads), total_q * lse_row}};
    step.done = [&groups, g] { groups.Finished(g); };
  }
  const GatheredInput q = {{in.q.data, in.q.size_bytes}}, k = {{in.k.data, in.k.size_bytes}},
                      v = {{in.v.data, in.v.size_bytes}};
  return lane.RunSteps(
      {q,
       k,
       v,
       {{in.cu_seqlens_q.data(), cu_q_bytes}},
       {{in.cu_seqlens_k.data(), cu_k_bytes}},
       {{plan.offsets.data(), plan.offsets_bytes()}}},
      {static_cast<size_t>(total_q) * q_row, static_cast<size_t>(heads * total_q) * lse_row},
      scratch_bytes + kernel_workspace, steps, keep, in.output_space.destinations);
}

}  // namespace attnserve::engine
