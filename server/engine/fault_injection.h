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
  // Then every this many launches after it as well (0 = once): a soak sees the device fault,
  // come back and fault again within one server lifetime.
  int64_t every = 0;
  int failed_resets = 0;  // reset attempts after the first fault that fail before one succeeds
};

// By device name. The spec is a comma-separated list of DEVICE@LAUNCH[+EVERY][/FAILED_RESETS],
// e.g. "cpu@3", "cuda:0@5/2,cuda:1@9" or "cuda:0@50+400"; empty = none. INVALID_ARGUMENT naming
// the bad entry.
absl::StatusOr<std::map<std::string, InjectedFault>> ParseInjectedFaults(absl::string_view spec);

}  // namespace attnserve::engine
