#include "server/engine/device_fault.h"

#include "absl/strings/cord.h"

namespace attnserve::engine {
namespace {

constexpr absl::string_view kDeviceFaultPayload = "attnserve.dev/device-fault";

}  // namespace

absl::Status DeviceFaultError(absl::string_view message) {
  absl::Status status = absl::UnavailableError(message);
  status.SetPayload(kDeviceFaultPayload, absl::Cord("1"));
  return status;
}

bool IsDeviceFault(const absl::Status& status) {
  return status.GetPayload(kDeviceFaultPayload).has_value();
}

}  // namespace attnserve::engine
