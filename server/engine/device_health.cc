#include "server/engine/device_health.h"

#include <cstdio>


namespace attnserve::engine {

DeviceHealth::DeviceHealth(std::string device, InjectedFault injected,
                           metrics::ServerMetrics* metrics)
    : device_(std::move(device)), metrics_(metrics), injected_(injected) {
  if (metrics_ != nullptr) metrics_->SetDeviceHealthy(device_, true);
}

DeviceHealthReport DeviceHealth::Report() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_;
}

bool DeviceHealth::healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_.healthy;
}

bool DeviceHealth::CountLaunchIsInjectedFault() {
  std::lock_guard<std::mutex> lock(mu_);
  ++launches_;
  if (injected_.launch < 1 || launches_ < injected_.launch) return false;
  if (injected_.every < 1) return launches_ == injected_.launch;
  return (launches_ - injected_.launch) % injected_.every == 0;
}

bool DeviceHealth::MarkFaulted(const absl::Status& fault) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!report_.healthy) return false;
    report_.healthy = false;
    report_.fault = std::string(fault.message());
  }
  if (metrics_ != nullptr) {
    metrics_->SetDeviceHealthy(device_, false);
    metrics_->RecordDeviceFault(device_);
  }
  return true;
}

absl::Status DeviceHealth::RecordReset(absl::Status result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (result.ok() && injected_.failed_resets > 0) {
      --injected_.failed_resets;
      result = absl::InternalError("injected reset failure (--inject_device_fault)");
    }
    if (result.ok()) {
      report_ = DeviceHealthReport{};
    } else {
      ++report_.failed_resets;
      report_.reset_error = std::string(result.message());
    }
  }
  if (!result.ok()) {
    std::fprintf(stderr, "attnserve: %s: reset after a device fault failed: %s\n",
                 device_.c_str(), std::string(result.message()).c_str());
  }
  if (metrics_ != nullptr) {
    metrics_->RecordDeviceReset(device_, result.ok());
    if (result.ok()) metrics_->SetDeviceHealthy(device_, true);
  }
  return result;
}

}  // namespace attnserve::engine
