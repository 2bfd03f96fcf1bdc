// Requests whose tensors lie in this device's memory (resident_device.h: a co-located client's
// CUDA shared memory), on a CUDA lane: the kernels read q, k, v (and dout, out, lse) where they
// are, only the offsets cross PCIe, and the outputs are copied to their destinations (the
// client's device memory, device to device) or to the lane's pinned memory.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/kernel_families.h"
#include "server/engine/attention_request.h"
#include "server/engine/cuda_grouped_forward.h"
#include "server/engine/cuda_lane.h"
#include "server/engine/launch_split.h"

namespace attnserve::engine {

// Outputs: out, lse.
absl::StatusOr<LaneRun> RunResidentForward(const kernels::KernelFamilyEntry& family,
                                           const ForwardInputs& in, CudaLane& lane,
                                           const DeviceContextFn& device_context);
// Outputs: dq, dk, dv. Needs query and key rows (the caller zeroes gradients without them).
absl::StatusOr<LaneRun> RunResidentBackward(const kernels::KernelFamilyEntry& family,
                                            const BackwardInputs& in, CudaLane& lane,
                                            const DeviceContextFn& device_context);

// The same as several launches (launch_split.h: `split` is PlanLaunchSplit's, not empty), read
// at offsets into the device tensors; `hooks.before_launch` stops the request between them.
absl::StatusOr<LaneRun> RunResidentForwardLaunches(const kernels::KernelFamilyEntry& family,
                                                   const ForwardInputs& in,
                                                   const std::vector<LaunchRange>& split,
                                                   const LaunchHooks& hooks, CudaLane& lane,
                                                   const DeviceContextFn& device_context);
absl::StatusOr<LaneRun> RunResidentBackwardLaunches(const kernels::KernelFamilyEntry& family,
                                                    const BackwardInputs& in,
                                                    const std::vector<LaunchRange>& split,
                                                    const LaunchHooks& hooks, CudaLane& lane,
                                                    const DeviceContextFn& device_context);

// Zeroes `bytes` of device memory at `at` (a destination of a backward without queries or
// keys: every gradient is zero) and waits.
absl::Status ZeroDeviceBytes(char* at, size_t bytes, int device);

}  // namespace attnserve::engine
