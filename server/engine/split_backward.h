// A backward run on the host as several launches (launch_split.h): groups of whole sequences,
// and blocks of one long sequence's query rows. A block writes its rows of dq directly; its dk
// and dv are partial sums over its rows for the sequence's keys [0, key_end), which are added,
// block after block in the plan's order, into float32 accumulators sized to that one
// sequence's keys, and written in the output dtype after the sequence's last block. Between
// launches `before_launch` may stop the request (deadline passed, caller gone).
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/attention_request.h"
#include "server/engine/kernel_runner.h"
#include "server/engine/launch_split.h"

namespace attnserve::engine {

// `in` is validated and complete (no groups still arriving); `ranges` is a PlanLaunchSplit of
// it. dq, dk and dv go to in.output_space's destinations where given (host memory), else into
// the result's own tensors.
absl::StatusOr<BackwardResult> RunBackwardInLaunches(
    const KernelFamily& family, const BackwardInputs& in, const std::vector<LaunchRange>& ranges,
    const kernels::ExecutionContext& ctx, const std::function<absl::Status()>& before_launch);

// accumulator[i] += float(partial[i]) for `elements` elements of `dtype`.
void AccumulatePartial(kernels::DType dtype, const char* partial, int64_t elements,
                       float* accumulator);
// out[i] = accumulator[i] in `dtype` (round to nearest even).
void StoreAccumulated(kernels::DType dtype, const float* accumulator, int64_t elements,
                      char* out);

}  // namespace attnserve::engine
