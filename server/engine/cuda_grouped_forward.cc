#include "server/engine/cuda_grouped_forward.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/engine/kernel_runner.h"
#include "server/engine/sequence_groups.h"

namespace attnserve::engine {
namespace {

size_t RowBytes(const TensorView& t) {
  return static_cast<size_t>(t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype));
}

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

// One group's rows and its own launch's parameters (host offsets rebased to its first
// sequence; device pointers are filled in at launch).
struct GroupLaunch {
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  std::vector<int32_t> cu_q, cu_k;
  size_t cu_q_at = 0, cu_k_at = 0;  // where they start in the offsets input, in int32s
  kernels::ForwardParams params;
};

}  // namespace

absl::StatusOr<LaneRun> RunForwardInGroups(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep) {
  SequenceGroups& groups = *in.groups;
  const int64_t heads = in.q.shape[1], total_q = in.q.shape[0];
  const size_t q_row = RowBytes(in.q), k_row = RowBytes(in.k), lse_row = sizeof(float);
  // Every group's rebased offsets, back to back in one small input.
  std::vector<int32_t> group_offsets;
  std::vector<GroupLaunch> launches(groups.count());
  size_t kernel_workspace = 0, lse_scratch = 0;
  for (int g = 0; g < groups.count(); ++g) {
    GroupLaunch& launch = launches[g];
    const int32_t b0 = groups.first_sequence(g), b1 = groups.end_sequence(g);
    launch.q0 = in.cu_seqlens_q[b0];
    launch.q1 = in.cu_seqlens_q[b1];
    launch.k0 = in.cu_seqlens_k[b0];
    launch.k1 = in.cu_seqlens_k[b1];
    launch.cu_q = Rebased(in.cu_seqlens_q, b0, b1);
    launch.cu_k = Rebased(in.cu_seqlens_k, b0, b1);
    launch.cu_q_at = group_offsets.size();
    group_offsets.insert(group_offsets.end(), launch.cu_q.begin(), launch.cu_q.end());
    launch.cu_k_at = group_offsets.size();
    group_offsets.insert(group_offsets.end(), launch.cu_k.begin(), launch.cu_k.end());
    launch.params.shape = ShapeOf(RowsOfView(in.q, launch.q0, launch.q1),
                                  RowsOfView(in.k, launch.k0, launch.k1), launch.cu_q, launch.cu_k);
    launch.params.options = ResolveOptions(in.options, launch.params.shape.head_dim);
    kernel_workspace = std::max(kernel_workspace, family.forward_workspace_bytes(launch.params));
    lse_scratch =
        std::max(lse_scratch, static_cast<size_t>(heads * (launch.q1 - launch.q0)) * lse_row);
  }
  // Workspace: [a group's lse, [heads, rows] as its launch writes it | the kernel's own].
  const size_t scratch_bytes = AlignUp(lse_scratch);
  const auto whole = [](size_t bytes) { return ByteRange{0, bytes}; };
  const size_t offsets_bytes = group_offsets.size() * sizeof(int32_t);
  const size_t cu_q_bytes = in.cu_seqlens_q.size() * sizeof(int32_t);
  const size_t cu_k_bytes = in.cu_seqlens_k.size() * sizeof(int32_t);

  std::vector<LaneStep> steps(groups.count());
  for (int g = 0; g < groups.count(); ++g) {
    const GroupLaunch& group = launches[g];
    const int64_t rows = group.q1 - group.q0;
    LaneStep& step = steps[g];
    step.ready = [&groups, g] { return groups.WaitFor(g); };
    // The offsets (the whole forward's too, for a kept context) cross with the first group.
    step.inputs = {
        {group.q0 * q_row, group.q1 * q_row},     {group.k0 * k_row, group.k1 * k_row},
        {group.k0 * k_row, group.k1 * k_row},     g == 0 ? whole(cu_q_bytes) : ByteRange{},
        g == 0 ? whole(cu_k_bytes) : ByteRange{}, g == 0 ? whole(offsets_bytes) : ByteRange{}};
    step.launch = [&, launch = &group, rows](const DeviceBuffers& d,
                                             cudaStream_t stream) -> absl::Status {
      if (rows == 0) return absl::OkStatus();
      kernels::ForwardParams params = launch->params;
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
      if (!status.ok) {
        return absl::InternalError(absl::StrCat(family.name, " forward: ", status.message));
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
       {{group_offsets.data(), offsets_bytes}}},
      {static_cast<size_t>(total_q) * q_row, static_cast<size_t>(heads * total_q) * lse_row},
      scratch_bytes + kernel_workspace, steps, keep, in.output_space.destinations);
}

}  // namespace attnserve::engine
