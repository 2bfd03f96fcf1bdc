// A backward whose inputs arrive group by group (sequence_groups.h), on a CUDA lane in steps,
// as cuda_grouped_forward.h runs a forward: group g's rows of dout (and of q, k, v, out when
// they travel; lse crosses whole with the first group) go to the device as soon as they are
// in, run as their own varlen launch, and its dq, dk, dv rows come back while later groups
// still arrive, each group reported finished once they are at their destinations, so the
// transport streams them. A backward on a device context reads the context where it lies.
#pragma once

#include <array>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/kernel_families.h"
#include "server/engine/attention_request.h"
#include "server/engine/cuda_grouped_forward.h"
#include "server/engine/cuda_lane.h"
#include "server/engine/saved_context.h"

namespace attnserve::engine {

// A backward as a lane runs it in several launches (ForwardLaunchSet's counterpart): dout, then
// (without a context) q, k, v, out and lse ([heads, total_q]), as pieces.
struct BackwardLaunchSet {
  TensorView q, k;
  std::vector<GatheredInput> tensors;
  const std::vector<int32_t>* cu_seqlens_q = nullptr;
  const std::vector<int32_t>* cu_seqlens_k = nullptr;
  RequestOptions options;
  bool deterministic = false;
  std::string code_path;  // the route's: the family's workspace may depend on it
  std::vector<char*> destinations;
  // A resident request (cuda_resident.h): dout, q, k, v, out and lse already lie in this
  // device's memory here, `tensors` is empty and only the launches' offsets cross. All null:
  // the tensors travel (or q, k, v, out and lse come from a context).
  std::array<const char*, 6> resident = {};
};

// Runs `plan`'s launches in order on the lane: a group of whole sequences writes its rows of
// dq, dk and dv; a block of one sequence's rows (launch_split.h) writes its rows of dq and
// partial dk and dv into device scratch, which a small kernel (kernels/gradient_sum) adds into
// float32 sums in the workspace, written out as the sequence's dk and dv after its last block.
// `context`: the device context it reads q, k, v, out and lse from, or null when they travel.
absl::StatusOr<LaneRun> RunBackwardLaunches(const kernels::KernelFamilyEntry& family,
                                            const BackwardLaunchSet& set,
                                            const GroupLaunches& plan, const LaunchHooks& hooks,
                                            CudaLane& lane, const DeviceContextFn& device_context,
                                            const ContextMemory* context);

// `in.groups` is set; q, k and v give the shapes (a context's, filled in). `context`: the
// device context the backward runs on, or null when every input travels. Outputs go to
// in.output_space's destinations where given, else to the lane's pinned memory.
absl::StatusOr<LaneRun> RunBackwardInGroups(const kernels::KernelFamilyEntry& family,
                                            const BackwardInputs& in, CudaLane& lane,
                                            const DeviceContextFn& device_context,
                                            const ContextMemory* context,
                                            const GroupCut& cut = {});

}  // namespace attnserve::engine
