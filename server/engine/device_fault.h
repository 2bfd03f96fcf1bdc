// A device fault: an error after which the device cannot run anything until its context is
// reset (a CUDA "sticky" error: illegal address, uncorrectable ECC, a kernel that trapped). It
// travels as an UNAVAILABLE status (retryable: the request may succeed on another device or
// after the reset) marked with a payload, so the queue worker that sees it in a launch's answer
// can tell it from an error of the request itself and take the device out of service
// (device_health.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::engine {

// UNAVAILABLE with `message`, marked as a device fault.
absl::Status DeviceFaultError(absl::string_view message);

// Whether `status` came from DeviceFaultError.
bool IsDeviceFault(const absl::Status& status);

}  // namespace attnserve::engine
