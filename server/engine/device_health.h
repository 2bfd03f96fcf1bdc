// Whether a device may run requests. A device fault (device_fault.h) seen in any launch takes
// it out of service: its lanes stop taking jobs, its queue goes to other devices, readiness and
// GetServerInfo say so, and it comes back only once a reset of its context has succeeded
// (retried with a doubling interval while it fails). Also counts launches and reset attempts
// for test-only fault injection (fault_injection.h). Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/engine/fault_injection.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {

class DeviceHealth {
 public:
  // `metrics` may be null; otherwise it must outlive this object.
  DeviceHealth(std::string device, InjectedFault injected, metrics::ServerMetrics* metrics);

  DeviceHealthReport Report() const;
  bool healthy() const;

  // Counts a launch; true when it is the one --inject_device_fault makes fail.
  bool CountLaunchIsInjectedFault();
  // Takes the device out of service; false when it already was.
  bool MarkFaulted(const absl::Status& fault);
  // The result of a reset attempt: OK puts the device back in service. An injected reset
  // failure turns an OK into a failure (so tests see the device stay out until a reset works).
  // Returns the result as counted.
  absl::Status RecordReset(absl::Status result);

 private:
  const std::string device_;
  metrics::ServerMetrics* const metrics_;
  mutable std::mutex mu_;
  DeviceHealthReport report_;
  InjectedFault injected_;
  int64_t launches_ = 0;
};

}  // namespace attnserve::engine
