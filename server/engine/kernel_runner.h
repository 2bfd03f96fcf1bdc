// Turns a validated engine request into the kernels' plain parameter struct, allocates the
// outputs and runs one kernel family's entry point. The only place engine types meet kernels/.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/attention_params.h"
#include "server/engine/attention_request.h"

namespace attnserve::engine {

// One kernel family's entry points, e.g. {"reference", reference::Forward, reference::Backward}.
struct KernelFamily {
  const char* name;
  kernels::ForwardFn forward;
  kernels::BackwardFn backward;
};

// Inputs must have passed ValidateForward / ValidateBackward.
absl::StatusOr<ForwardResult> RunForward(const KernelFamily& family, const ForwardInputs& inputs,
                                         const kernels::ExecutionContext& ctx);
absl::StatusOr<BackwardResult> RunBackward(const KernelFamily& family,
                                           const BackwardInputs& inputs,
                                           const kernels::ExecutionContext& ctx);

}  // namespace attnserve::engine
