// A forward whose sequences arrive group by group (sequence_groups.h), on a CUDA lane in
// steps: group g's rows cross to the device as soon as they are in, run as their own varlen
// launch, and come back (out rows, lse columns) while later groups still arrive, each group
// reported finished once its outputs are at their destinations, so the transport streams
// them. The device buffer is laid out as a whole forward's, so a kept context is the same.
// A forward too long for one launch (launch_split.h) runs through the same steps, cut by
// estimated work instead of arrival.
#pragma once

#include <array>

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernel_families.h"
#include "server/engine/attention_request.h"
#include "server/engine/cuda_lane.h"
#include "server/engine/group_launch.h"

namespace attnserve::engine {

// The kernels' execution context for a launch on `stream` with this workspace.
using DeviceContextFn =
    std::function<kernels::ExecutionContext(cudaStream_t stream, void* workspace, size_t bytes)>;

// A forward as a lane runs it in several launches, whatever it came as (one request, or a
// batch's parts end to end): shapes of the whole (rows: every part's; the data is unused),
// the tensors' pieces, the offsets, and where the outputs go (none: the lane's pinned memory).
struct ForwardLaunchSet {
  TensorView q, k;
  GatheredInput q_data, k_data, v_data;
  const std::vector<int32_t>* cu_seqlens_q = nullptr;
  const std::vector<int32_t>* cu_seqlens_k = nullptr;
  RequestOptions options;
  std::vector<char*> destinations;
  // A resident request (cuda_resident.h): q, k and v already lie in this device's memory here,
  // *_data are empty and only the offsets cross (nothing is kept). All null: they travel.
  std::array<const char*, 3> resident = {};
};

// What runs around launch g (each may be empty): `ready(g)` before its inputs cross,
// `before_launch` between the previous launch's end and its own (LaneStep::before_launch),
// `done(g)` once its outputs are at their destinations (LaneStep::done's rules).
struct LaunchHooks {
  std::function<absl::Status(int)> ready;
  std::function<absl::Status()> before_launch;
  std::function<void(int)> done;
};

// Runs `plan`'s launches in order on the lane; the device buffer is laid out as one launch's
// ([q, k, v, cu_seqlens_q, cu_seqlens_k, the plan's offsets | out, lse]), so a kept context is
// the same whichever way it ran. Each launch's out rows and lse columns land where the whole
// launch would have written them.
absl::StatusOr<LaneRun> RunForwardLaunches(const kernels::KernelFamilyEntry& family,
                                           const ForwardLaunchSet& set,
                                           const GroupLaunches& plan, const LaunchHooks& hooks,
                                           CudaLane& lane, const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep);

// How a request arriving group by group is cut: each group's pieces (CutGroups' `cut`), and
// the check between launches (LaunchHooks::before_launch). Both empty: a launch per group,
// queued without waiting, as before launches were split.
struct GroupCut {
  std::function<std::vector<LaunchRange>(int32_t, int32_t)> cut;
  std::function<absl::Status()> before_launch;
  size_t* launches = nullptr;  // where given: set to how many launches ran (or were planned)
};

// The hooks of such a request in `group_of`'s launches (GroupPieces): a group's first launch
// waits for it to arrive, its last reports it finished. Both must outlive the run.
LaunchHooks ArrivalHooks(SequenceGroups& groups, const std::vector<int>& group_of,
                         std::function<absl::Status()> before_launch);

// `in.groups` is set. Outputs go to in.output_space's destinations where given, else to the
// lane's pinned memory (the LaneRun's outputs), as CudaLane::Run's do.
absl::StatusOr<LaneRun> RunForwardInGroups(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep,
                                           const GroupCut& cut = {});

}  // namespace attnserve::engine
