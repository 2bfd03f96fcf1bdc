#include "server/engine/cuda_resident.h"

#include <vector>

#include "server/engine/cuda_grouped_backward.h"
#include "server/engine/group_launch.h"
#include "server/engine/kernel_launch_status.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {
namespace {

GatheredInput OffsetsInput(const std::vector<int32_t>& offsets) {
  return {{offsets.data(), offsets.size() * sizeof(int32_t)}};
}

}  // namespace

absl::StatusOr<LaneRun> RunResidentForward(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context) {
  kernels::ForwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  params.q = in.q.data;
  params.k = in.k.data;
  params.v = in.v.data;
  const size_t lse_bytes = sizeof(float) * params.shape.num_heads * params.shape.total_q;
  const size_t workspace_bytes = family.forward_workspace_bytes(params);
  return lane.Run(
      {OffsetsInput(in.cu_seqlens_q), OffsetsInput(in.cu_seqlens_k)}, {in.q.size_bytes, lse_bytes},
      workspace_bytes,
      [&](const DeviceBuffers& d, cudaStream_t stream) {
        params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(d.inputs[0]);
        params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(d.inputs[1]);
        params.out = d.outputs[0];
        params.lse = reinterpret_cast<float*>(d.outputs[1]);
        return KernelLaunchStatus(family, "forward",
                          family.forward(params, device_context(stream, d.workspace,
                                                                workspace_bytes)));
      },
      /*keep=*/nullptr, in.output_space.destinations);
}

absl::StatusOr<LaneRun> RunResidentBackward(const kernels::KernelFamilyEntry& family,
                                            const BackwardInputs& in, CudaLane& lane,
                                            const DeviceContextFn& device_context) {
  kernels::BackwardParams params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  params.deterministic = in.deterministic;
  params.dout = in.dout.data;
  params.q = in.q.data;
  params.k = in.k.data;
  params.v = in.v.data;
  params.out = in.out.data;
  params.lse = reinterpret_cast<const float*>(in.lse.data);
  const size_t workspace_bytes = family.backward_workspace_bytes(params, in.route.code_path);
  return lane.Run(
      {OffsetsInput(in.cu_seqlens_q), OffsetsInput(in.cu_seqlens_k)},
      {in.q.size_bytes, in.k.size_bytes, in.v.size_bytes}, workspace_bytes,
      [&](const DeviceBuffers& d, cudaStream_t stream) {
        params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(d.inputs[0]);
        params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(d.inputs[1]);
        params.dq = d.outputs[0];
        params.dk = d.outputs[1];
        params.dv = d.outputs[2];
        return KernelLaunchStatus(family, "backward",
                          family.backward(params, device_context(stream, d.workspace,
                                                                 workspace_bytes)));
      },
      /*keep=*/nullptr, in.output_space.destinations);
}

absl::StatusOr<LaneRun> RunResidentForwardLaunches(const kernels::KernelFamilyEntry& family,
                                                   const ForwardInputs& in,
                                                   const std::vector<LaunchRange>& split,
                                                   const LaunchHooks& hooks, CudaLane& lane,
                                                   const DeviceContextFn& device_context) {
  ForwardLaunchSet set;
  set.q = in.q;
  set.k = in.k;
  set.cu_seqlens_q = &in.cu_seqlens_q;
  set.cu_seqlens_k = &in.cu_seqlens_k;
  set.options = in.options;
  set.destinations = in.output_space.destinations;
  set.resident = {in.q.data, in.k.data, in.v.data};
  const GroupLaunches plan =
      PlanSplitLaunches(split, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  return RunForwardLaunches(family, set, plan, hooks, lane, device_context, /*keep=*/nullptr);
}

absl::StatusOr<LaneRun> RunResidentBackwardLaunches(const kernels::KernelFamilyEntry& family,
                                                    const BackwardInputs& in,
                                                    const std::vector<LaunchRange>& split,
                                                    const LaunchHooks& hooks, CudaLane& lane,
                                                    const DeviceContextFn& device_context) {
  BackwardLaunchSet set;
  set.q = in.q;
  set.k = in.k;
  set.cu_seqlens_q = &in.cu_seqlens_q;
  set.cu_seqlens_k = &in.cu_seqlens_k;
  set.options = in.options;
  set.deterministic = in.deterministic;
  set.code_path = in.route.code_path;
  set.destinations = in.output_space.destinations;
  set.resident = {in.dout.data, in.q.data, in.k.data, in.v.data, in.out.data, in.lse.data};
  const GroupLaunches plan =
      PlanSplitLaunches(split, in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  return RunBackwardLaunches(family, set, plan, hooks, lane, device_context,
                             /*context=*/nullptr);
}

absl::Status ZeroDeviceBytes(char* at, size_t bytes, int device) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  return CudaStatus(cudaMemset(at, 0, bytes), "cudaMemset (gradients without queries or keys)");
}

}  // namespace attnserve::engine
