#include "server/engine/resident_device.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::engine {
namespace {

// All inputs on one device or all on the host; outputs on the host, or on the inputs' device.
absl::StatusOr<int> CommonDevice(
    const std::vector<std::pair<const TensorView*, const char*>>& inputs,
    const OutputSpace& outputs) {
  const auto& [first, first_name] = inputs.front();
  const int device = first->device;
  for (const auto& [tensor, name] : inputs) {
    if (tensor->device != device) {
      auto where = [](int d) {
        return d < 0 ? std::string("host memory") : absl::StrCat("CUDA device ", d, "'s memory");
      };
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": in ", where(tensor->device), ", but ", first_name, " is in ", where(device),
          "; a request's tensors are all in CUDA shared memory of one device, or none is"));
    }
  }
  if (outputs.device >= 0 && outputs.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outputs: in CUDA device ", outputs.device, "'s memory, which only a request whose "
        "inputs lie there too may write"));
  }
  return device;
}

}  // namespace

absl::StatusOr<int> ResidentDevice(const ForwardInputs& in) {
  absl::StatusOr<int> device = CommonDevice({{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}},
                                            in.output_space);
  if (device.ok() && *device >= 0 && in.keep_context) {
    return absl::InvalidArgumentError(
        "keep_context: not with tensors in CUDA shared memory (send them again for the "
        "backward: they are read where they lie)");
  }
  return device;
}

absl::StatusOr<int> ResidentDevice(const BackwardInputs& in) {
  if (!in.context_id.empty()) {
    // A context's tensors are views the engine filled in; dout alone comes from the caller.
    absl::StatusOr<int> device = CommonDevice({{&in.dout, "dout"}}, in.output_space);
    if (device.ok() && *device >= 0) {
      return absl::InvalidArgumentError(
          "context_id: not with tensors in CUDA shared memory (send the backward in full)");
    }
    return device;
  }
  return CommonDevice({{&in.dout, "dout"},
                       {&in.q, "q"},
                       {&in.k, "k"},
                       {&in.v, "v"},
                       {&in.out, "out"},
                       {&in.lse, "lse"}},
                      in.output_space);
}

}  // namespace attnserve::engine
