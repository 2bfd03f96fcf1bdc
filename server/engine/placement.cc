#include "server/engine/placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/devices/capability_emulation.h"
#include "server/engine/work_estimate.h"

namespace attnserve::engine {
namespace {

// Estimates this close count as equal, and the shorter queue decides: a request of a few
// microseconds should not pile onto one device because of rounding.
bool NearlyEqual(double a, double b) {
  return std::abs(a - b) <= 1e-6 + 0.01 * std::max(a, b);
}

// The bytes the request holds in this device's memory budget: on the host CPU device its
// tensors are that device's memory; on a GPU also the workspace its family allocates with
// them; requests a GPU worker runs on the host hold none of the GPU's.
int64_t ChargedBytes(const RequestProfile& request, const std::string& family,
                     const DeviceState& device) {
  if (device.compute_capability == 0) return request.device_bytes;
  if (RunsOnGpu(family, device.compute_capability)) {
    return request.device_bytes + request.WorkspaceBytes(family);
  }
  return 0;
}

bool FitsBudget(int64_t bytes, int64_t budget) { return budget == 0 || bytes <= budget; }

bool WithinCompute(double seconds, double limit) { return limit <= 0 || seconds <= limit; }

absl::Status ComputeLimitError(const RequestProfile& request, const DeviceState& fastest,
                               double seconds, double limit, size_t devices) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the request's estimated compute time, %.3g s on %s%s (%.3g attention scores, %.3g FLOPs), "
      "exceeds the server's limit max_request_compute_seconds = %g; send fewer or shorter "
      "sequences per request",
      seconds, devices > 1 ? "the fastest device that can hold it, " : "", fastest.name,
      request.scores, request.flops, limit));
}

}  // namespace

DeviceState RoutingStateOf(const devices::DeviceDescription& device, KernelCatalog catalog) {
  DeviceState state;
  state.name = device.name;
  state.compute_capability =
      device.kind == devices::DeviceKind::kCpu
          ? 0
          : std::max(0, devices::ParseComputeCapability(device.compute_capability));
  state.native_compute_capability =
      std::max(0, devices::ParseComputeCapability(device.native_compute_capability));
  state.shared_memory_per_block = device.shared_memory_per_block;
  state.catalog = std::move(catalog);
  return state;
}

Route RouteOn(const RequestProfile& request, const DeviceState& device) {
  return ChooseRoute({device.compute_capability, request.direction, request.dtype,
                      request.head_dim, device.shared_memory_per_block, request.dropout,
                      request.alibi, request.deterministic, device.native_compute_capability},
                     device.catalog);
}

double EstimatedSeconds(const RequestProfile& request, const std::string& family,
                        const DeviceState& device) {
  return EstimatedSeconds(request, family, device.compute_capability, device.host_threads);
}

absl::Status CheckPlaceable(const RequestProfile& request, const std::vector<DeviceState>& devices,
                            double max_compute_seconds) {
  const DeviceState* largest = nullptr;
  int64_t largest_charge = 0;
  const DeviceState* fastest = nullptr;
  double fastest_seconds = 0;
  std::string no_family_reason;
  for (const DeviceState& device : devices) {
    const Route route = RouteOn(request, device);
    if (route.family.empty()) {
      no_family_reason = route.reason;
      continue;
    }
    const int64_t charge = ChargedBytes(request, route.family, device);
    if (!FitsBudget(charge, device.memory_budget)) {
      if (largest == nullptr || device.memory_budget > largest->memory_budget) {
        largest = &device;
        largest_charge = charge;
      }
      continue;
    }
    const double seconds = EstimatedSeconds(request, route.family, device);
    if (WithinCompute(seconds, max_compute_seconds)) return absl::OkStatus();
    if (fastest == nullptr || seconds < fastest_seconds) {
      fastest = &device;
      fastest_seconds = seconds;
    }
  }
  if (fastest != nullptr) {
    return ComputeLimitError(request, *fastest, fastest_seconds, max_compute_seconds,
                             devices.size());
  }
  if (largest == nullptr) {
    return absl::FailedPreconditionError(no_family_reason);
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the request needs about ", largest_charge, " bytes of device memory; ",
                   devices.size() > 1 ? "the largest device, " : "", largest->name, ", has ",
                   largest->memory_budget, " in all"));
}

std::optional<Placement> Place(const RequestProfile& request,
                               const std::vector<DeviceState>& devices, int64_t max_queue_size,
                               double max_compute_seconds) {
  std::optional<Placement> best;
  double best_finish = 0;
  size_t best_depth = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceState& device = devices[i];
    const Route route = RouteOn(request, device);
    const std::string& family = route.family;
    if (family.empty()) continue;
    const int64_t charge = ChargedBytes(request, family, device);
    if (!FitsBudget(charge, device.memory_budget)) continue;
    if (static_cast<int64_t>(device.queue_depth) >= max_queue_size) continue;
    Placement candidate;
    candidate.seconds = EstimatedSeconds(request, family, device);
    if (!WithinCompute(candidate.seconds, max_compute_seconds)) continue;
    candidate.device = i;
    candidate.family = family;
    candidate.route = route;
    candidate.device_bytes = charge;
    candidate.fits_now = FitsBudget(device.reserved_bytes + charge, device.memory_budget);
    const double finish = device.queued_seconds + candidate.seconds;
    bool better;
    if (!best) {
      better = true;
    } else if (candidate.fits_now != best->fits_now) {
      better = candidate.fits_now;
    } else if (!NearlyEqual(finish, best_finish)) {
      better = finish < best_finish;
    } else {
      better = device.queue_depth < best_depth;
    }
    if (better) {
      best = candidate;
      best_finish = finish;
      best_depth = device.queue_depth;
    }
  }
  return best;
}

}  // namespace attnserve::engine
