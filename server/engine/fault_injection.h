// Test-only fault injection (--inject_device_fault): makes the Nth launch on a device fail as a
// device fault, so the fault path (device_health.h) runs in CI on the CPU device and with a
// real trapped kernel on a GPU. Never set in production.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::engine {

struct InjectedFault {
  int64_t launch = 0;     // 1-based launch on the device that faults; 0 = none
  int failed_resets = 0;  // reset attempts after it that fail before one succeeds
};

// By device name. The spec is a comma-separated list of DEVICE@LAUNCH[/FAILED_RESETS], e.g.
// "cpu@3" or "cuda:0@5/2,cuda:1@9"; empty = none. INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::map<std::string, InjectedFault>> ParseInjectedFaults(absl::string_view spec);

}  // namespace attnserve::engine
