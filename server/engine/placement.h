// Placement: which device a request goes to. Each device is scored by when the request would
// finish there: the work already queued on it (estimated seconds) plus this request's own
// estimate, FLOPs over the rate of the kernel family the routing table picks for it on that
// device, plus its bytes over the host link when the family runs on the GPU. Among devices
// with room for it now the earliest finish wins (near-ties: the shorter queue); when none has
// room now, it waits on the best device that can ever hold it. The rates are rough
// (the rate table in placement.cc); they only have to order devices, not predict latency.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/attention_request.h"
#include "server/engine/kernel_routing.h"

namespace attnserve::engine {

// One device as placement sees it at this moment.
struct DeviceState {
  std::string name;               // for messages: "cuda:0", "cpu"
  int compute_capability = 0;     // major * 10 + minor; 0 = the host CPU itself
  int shared_memory_per_block = 0;  // bytes a kernel block may use; 0 = unknown
  KernelCatalog catalog;          // the families its worker may run
  int64_t memory_budget = 0;      // bytes running requests may hold at once; 0 = unbounded
  int64_t reserved_bytes = 0;     // held now by running requests
  double queued_seconds = 0;      // estimated work queued and running
  size_t queue_depth = 0;         // jobs waiting
};

// What placement needs to know about a request.
struct RequestProfile {
  Direction direction = Direction::kForward;
  DType dtype = DType::kFloat32;
  int head_dim = 0;
  double flops = 0;          // request_cost.h's convention
  int64_t device_bytes = 0;  // memory it holds on a GPU while it runs
};

RequestProfile ProfileOf(const ForwardInputs& in);
RequestProfile ProfileOf(const BackwardInputs& in);

struct Placement {
  size_t device = 0;          // index into the states
  std::string family;         // the family the router picked there
  int64_t device_bytes = 0;   // what it reserves there (0 when it runs on the host)
  double seconds = 0;         // its own estimated run time there
  bool fits_now = true;       // false: it waits there for memory
};

// FLOP/s a family reaches on a device of `compute_capability` (0 = the host CPU).
double FamilyRate(const std::string& family, int compute_capability);

// Whether a family runs on the GPU (its bytes cross the host link and occupy device memory);
// "reference" runs on the host CPU, whatever device's queue it came through.
bool RunsOnGpu(const std::string& family, int compute_capability);

// The request's estimated run time with `family` on a device of `compute_capability`.
double EstimatedSeconds(const RequestProfile& request, const std::string& family,
                        int compute_capability);

// RESOURCE_EXHAUSTED, with the numbers, when no device could hold the request even idle, or
// FAILED_PRECONDITION with the router's reason when no device has a family for it (only when
// --kernel forces one); OK otherwise.
absl::Status CheckPlaceable(const RequestProfile& request, const std::vector<DeviceState>& devices);

// The best device for the request among those that can ever hold it and whose queue has fewer
// than `max_queue_size` jobs; nullopt when all of those queues are full. Call CheckPlaceable
// first.
std::optional<Placement> Place(const RequestProfile& request,
                               const std::vector<DeviceState>& devices, int64_t max_queue_size);

}  // namespace attnserve::engine
