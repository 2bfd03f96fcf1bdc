// Requests whose tensors lie in a CUDA device's memory (TensorView::device: a co-located
// client's CUDA shared memory): which device they must run on. Such a request runs alone, on
// that device, with a GPU kernel family that reads its tensors where they are; it cannot run
// on the host (the reference family reads host memory) nor keep a context (a kept forward's
// context is its launch buffer, which holds copies of the inputs).
#pragma once

#include "absl/status/statusor.h"
#include "server/engine/attention_request.h"

namespace attnserve::engine {

// The ordinal of the device all of the request's input tensors are on (its outputs go there
// or to host memory); -1 when every input is host memory. INVALID_ARGUMENT naming the field
// when some inputs are on a device and others not (or on another), when outputs are on a
// device the inputs are not, or when a request with device tensors uses a saved context.
absl::StatusOr<int> ResidentDevice(const ForwardInputs& inputs);
absl::StatusOr<int> ResidentDevice(const BackwardInputs& inputs);

// Whether any of a (validated) request's tensors or destinations lie in a device's memory.
template <typename Inputs>
bool IsResident(const Inputs& inputs) {
  return ResidentDevice(inputs).value_or(-1) >= 0;
}

}  // namespace attnserve::engine
