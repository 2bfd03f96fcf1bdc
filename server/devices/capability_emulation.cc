#include "server/devices/capability_emulation.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/architecture_limits.h"

namespace attnserve::devices {
namespace {

constexpr int kOldestGpuCapability = 70;  // Volta: the oldest the GPU families target

}  // namespace

int ParseComputeCapability(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  int major = 0, minor = 0;
  if (parts.size() != 2 || parts[1].size() != 1 || !absl::SimpleAtoi(parts[0], &major) ||
      !absl::SimpleAtoi(parts[1], &minor) || major < 1 || major > 99 || minor < 0) {
    return -1;
  }
  return major * 10 + minor;
}

absl::Status EmulateComputeCapability(absl::string_view spec,
                                      std::vector<DeviceDescription>* devices) {
  spec = absl::StripAsciiWhitespace(spec);
  if (spec.empty()) return absl::OkStatus();
  const int emulated = ParseComputeCapability(spec);
  if (emulated < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--emulate_compute_capability=", spec, ": expected major.minor, e.g. 7.5"));
  }
  if (emulated < kOldestGpuCapability) {
    return absl::InvalidArgumentError(absl::StrCat("--emulate_compute_capability=", spec,
                                                   ": no GPU kernel family runs below 7.0"));
  }
  bool any_gpu = false;
  for (DeviceDescription& device : *devices) {
    if (device.kind != DeviceKind::kCuda) continue;
    any_gpu = true;
    const int native = ParseComputeCapability(device.compute_capability);
    if (native < emulated) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--emulate_compute_capability=", spec, ": ", device.name, " is ",
          device.compute_capability, " and cannot run a newer architecture's code"));
    }
    device.native_compute_capability = device.compute_capability;
    device.compute_capability = std::string(spec);
    // Kernels are chosen as on the emulated GPU, whose blocks may get less shared memory.
    const int limit = kernels::SharedMemoryPerBlockOf(emulated);
    if (limit > 0 &&
        (device.shared_memory_per_block == 0 || limit < device.shared_memory_per_block)) {
      device.shared_memory_per_block = limit;
    }
  }
  if (!any_gpu) {
    return absl::InvalidArgumentError(absl::StrCat("--emulate_compute_capability=", spec,
                                                   ": the server has no GPU device"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::devices
