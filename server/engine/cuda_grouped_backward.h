// A backward whose inputs arrive group by group (sequence_groups.h), on a CUDA lane in steps,
// as cuda_grouped_forward.h runs a forward: group g's rows of dout (and of q, k, v, out when
// they travel; lse crosses whole with the first group) go to the device as soon as they are
// in, run as their own varlen launch, and its dq, dk, dv rows come back while later groups
// still arrive, each group reported finished once they are at their destinations, so the
// transport streams them. A backward on a device context reads the context where it lies.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/kernel_families.h"
#include "server/engine/attention_request.h"
#include "server/engine/cuda_grouped_forward.h"
#include "server/engine/cuda_lane.h"
#include "server/engine/saved_context.h"

namespace attnserve::engine {

// `in.groups` is set; q, k and v give the shapes (a context's, filled in). `context`: the
// device context the backward runs on, or null when every input travels. Outputs go to
// in.output_space's destinations where given, else to the lane's pinned memory.
absl::StatusOr<LaneRun> RunBackwardInGroups(const kernels::KernelFamilyEntry& family,
                                            const BackwardInputs& in, CudaLane& lane,
                                            const DeviceContextFn& device_context,
                                            const ContextMemory* context);

}  // namespace attnserve::engine
