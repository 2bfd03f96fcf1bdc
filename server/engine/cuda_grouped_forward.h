// A forward whose sequences arrive group by group (sequence_groups.h), on a CUDA lane in
// steps: group g's rows cross to the device as soon as they are in, run as their own varlen
// launch, and come back (out rows, lse columns) while later groups still arrive, each group
// reported finished once its outputs are at their destinations, so the transport streams
// them. The device buffer is laid out as a whole forward's, so a kept context is the same.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/kernel_families.h"
#include "server/engine/attention_request.h"
#include "server/engine/cuda_lane.h"

namespace attnserve::engine {

// The kernels' execution context for a launch on `stream` with this workspace.
using DeviceContextFn =
    std::function<kernels::ExecutionContext(cudaStream_t stream, void* workspace, size_t bytes)>;

// `in.groups` is set. Outputs go to in.output_space's destinations where given, else to the
// lane's pinned memory (the LaneRun's outputs), as CudaLane::Run's do.
absl::StatusOr<LaneRun> RunForwardInGroups(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context,
                                           std::unique_ptr<KeptDeviceMemory>* keep);

}  // namespace attnserve::engine
