// --emulate_compute_capability: makes real GPUs report an older compute capability to the
// router (and run that architecture's kernel code paths), so the pre-Ampere routes — Turing
// flash, the fallback kernels — can be tested end to end on the GPUs we have.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/devices/device_registry.h"

namespace attnserve::devices {

// `spec` is "major.minor" (e.g. "7.5"), or empty for no emulation. Sets every GPU's
// compute_capability to it and keeps the real one in native_compute_capability. Errors name
// the value: malformed, below 7.0 (no GPU family runs there), newer than a GPU's own (a GPU
// cannot run a newer architecture's code), or no GPU among the devices.
absl::Status EmulateComputeCapability(absl::string_view spec,
                                      std::vector<DeviceDescription>* devices);

// "9.0" -> 90; -1 when malformed.
int ParseComputeCapability(absl::string_view text);

}  // namespace attnserve::devices
