#include "server/engine/placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/engine/request_cost.h"

namespace attnserve::engine {
namespace {

// The rate table. Rough by design: it only has to rank devices and families.
//
// What a FlashAttention-2-class kernel reaches on each architecture's tensor cores: on sm90 our
// flash kernels measured 300-370 TFLOP/s (bench/RESULTS.md, H100); sm80 is A100-class (FA2
// reaches ~190 there); sm86/sm89 consumer Ampere/Ada about half of that; sm75 Turing (a T4
// peaks at 65 dense fp16); sm70 Volta (V100 peaks at 125, FA1-class kernels reach ~60).
double FlashClassRate(int compute_capability) {
  if (compute_capability >= 90) return 300e12;
  if (compute_capability >= 86) return 90e12;
  if (compute_capability >= 80) return 180e12;
  if (compute_capability >= 75) return 30e12;
  if (compute_capability >= 70) return 50e12;
  return 0;
}
// The tiled sm70+ fallback kernels run 3-5x slower than flash on the same GPU.
constexpr double kFallbackShare = 0.25;
// cuBLAS GEMMs with the scores materialized in device memory: bandwidth-bound softmax passes.
constexpr double kCublasShare = 0.15;
// The exact reference kernels on the host CPU (all cores), whichever queue they came through.
constexpr double kHostCpuRate = 0.05e12;
// Bytes per second a GPU request's tensors move between host and device: staging into pinned
// memory (one host memcpy) and PCIe, in series within a lane.
constexpr double kHostLinkBytesPerSecond = 10e9;

// Estimates this close count as equal, and the shorter queue decides: a request of a few
// microseconds should not pile onto one device because of rounding.
bool NearlyEqual(double a, double b) {
  return std::abs(a - b) <= 1e-6 + 0.01 * std::max(a, b);
}

template <typename Inputs>
RequestProfile Profile(const Inputs& in, Direction direction) {
  RequestProfile profile;
  profile.direction = direction;
  profile.dtype = in.q.dtype;
  profile.head_dim = static_cast<int>(in.q.shape[2]);
  profile.flops = AttentionFlops(in);
  profile.device_bytes = DeviceBytes(in);
  return profile;
}

std::string FamilyOn(const RequestProfile& request, const DeviceState& device) {
  return ChooseRoute({device.compute_capability, request.direction, request.dtype,
                      request.head_dim, device.shared_memory_per_block},
                     device.catalog)
      .family;
}

// The bytes the request holds in this device's memory budget: on the host CPU device its
// tensors are that device's memory; requests a GPU worker runs on the host hold none of the
// GPU's.
int64_t ChargedBytes(const RequestProfile& request, const std::string& family,
                     const DeviceState& device) {
  if (device.compute_capability == 0 || RunsOnGpu(family, device.compute_capability)) {
    return request.device_bytes;
  }
  return 0;
}

bool FitsBudget(int64_t bytes, int64_t budget) { return budget == 0 || bytes <= budget; }

}  // namespace

RequestProfile ProfileOf(const ForwardInputs& in) { return Profile(in, Direction::kForward); }
RequestProfile ProfileOf(const BackwardInputs& in) { return Profile(in, Direction::kBackward); }

bool RunsOnGpu(const std::string& family, int compute_capability) {
  return compute_capability > 0 && !family.empty() && family != "reference";
}

double FamilyRate(const std::string& family, int compute_capability) {
  if (!RunsOnGpu(family, compute_capability)) return kHostCpuRate;
  const double flash_class = FlashClassRate(compute_capability);
  if (family == "flash") return flash_class;
  if (family == "fallback") return kFallbackShare * flash_class;
  if (family == "cublas") return kCublasShare * flash_class;
  return kHostCpuRate;  // a family this table does not know yet: assume the slowest
}

double EstimatedSeconds(const RequestProfile& request, const std::string& family,
                        int compute_capability) {
  double seconds = request.flops / FamilyRate(family, compute_capability);
  if (RunsOnGpu(family, compute_capability)) {
    seconds += static_cast<double>(request.device_bytes) / kHostLinkBytesPerSecond;
  }
  return seconds;
}

absl::Status CheckPlaceable(const RequestProfile& request,
                            const std::vector<DeviceState>& devices) {
  const DeviceState* largest = nullptr;
  int64_t largest_charge = 0;
  std::string no_family_reason;
  for (const DeviceState& device : devices) {
    const Route route = ChooseRoute({device.compute_capability, request.direction, request.dtype,
                                     request.head_dim, device.shared_memory_per_block},
                                    device.catalog);
    if (route.family.empty()) {
      no_family_reason = route.reason;
      continue;
    }
    const int64_t charge = ChargedBytes(request, route.family, device);
    if (FitsBudget(charge, device.memory_budget)) return absl::OkStatus();
    if (largest == nullptr || device.memory_budget > largest->memory_budget) {
      largest = &device;
      largest_charge = charge;
    }
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
                               const std::vector<DeviceState>& devices, int64_t max_queue_size) {
  std::optional<Placement> best;
  double best_finish = 0;
  size_t best_depth = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceState& device = devices[i];
    const std::string family = FamilyOn(request, device);
    if (family.empty()) continue;
    const int64_t charge = ChargedBytes(request, family, device);
    if (!FitsBudget(charge, device.memory_budget)) continue;
    if (static_cast<int64_t>(device.queue_depth) >= max_queue_size) continue;
    Placement candidate;
    candidate.device = i;
    candidate.family = family;
    candidate.device_bytes = charge;
    candidate.seconds = EstimatedSeconds(request, family, device.compute_capability);
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
