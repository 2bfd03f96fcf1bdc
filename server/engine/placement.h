// Placement: which device a request goes to. Each device is scored by when the request would
// finish there: the work already queued on it (estimated seconds) plus this request's own
// estimate with the kernel family the routing table picks for it on that device
// (work_estimate.h). Among devices with room for it now the earliest finish wins (near-ties:
// the shorter queue); when none has room now, it waits on the best device that can ever hold
// it. Devices where its estimate exceeds the compute limit (--max_request_compute_seconds)
// never take it. The rates are rough; they order devices and bound what one request may hold
// a device for, they do not predict latency.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/devices/device_registry.h"
#include "server/engine/attention_request.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/request_cost.h"

namespace attnserve::engine {

// One device as placement sees it at this moment.
struct DeviceState {
  std::string name;               // for messages: "cuda:0", "cpu"
  int compute_capability = 0;     // major * 10 + minor, as routed; 0 = the host CPU itself
  int native_compute_capability = 0;  // the GPU's own under emulation; 0: compute_capability
  int shared_memory_per_block = 0;  // bytes a kernel block may use; 0 = unknown
  KernelCatalog catalog;          // the families its worker may run
  int host_threads = 1;           // threads the host CPU gives one request of a host family
  int64_t memory_budget = 0;      // bytes running requests may hold at once; 0 = unbounded
  int64_t reserved_bytes = 0;     // held now by running requests
  double queued_seconds = 0;      // estimated work queued and running
  size_t queue_depth = 0;         // jobs waiting
};

struct Placement {
  size_t device = 0;          // index into the states
  std::string family;         // the family the router picked there (route.family)
  Route route;                // that family and its code path: the job carries it to the worker
  int64_t device_bytes = 0;   // what it reserves there (0 when it runs on the host)
  double seconds = 0;         // its own estimated run time there
  bool fits_now = true;       // false: it waits there for memory
};

// What routing needs of a device (name, capabilities, shared memory, catalog); the load fields
// stay zero for the caller to fill.
DeviceState RoutingStateOf(const devices::DeviceDescription& device, KernelCatalog catalog);

// The route the request takes on `device` (kernel_routing.h): what placement scores it by and
// what the worker then runs.
Route RouteOn(const RequestProfile& request, const DeviceState& device);

// The request's estimated run time with `family` on `device` (work_estimate.h).
double EstimatedSeconds(const RequestProfile& request, const std::string& family,
                        const DeviceState& device);

// RESOURCE_EXHAUSTED, with the numbers, when no device could hold the request even idle, or
// when on every device that could its estimated run time exceeds `max_compute_seconds`
// (0: no limit); FAILED_PRECONDITION with the router's reason when no device has a family for
// it (only when --kernel forces one); OK otherwise.
absl::Status CheckPlaceable(const RequestProfile& request, const std::vector<DeviceState>& devices,
                            double max_compute_seconds = 0);

// The best device for the request among those that can ever hold it within
// `max_compute_seconds` (0: no limit) and whose queue has fewer than `max_queue_size` jobs;
// nullopt when all of those queues are full. Call CheckPlaceable first.
std::optional<Placement> Place(const RequestProfile& request,
                               const std::vector<DeviceState>& devices, int64_t max_queue_size,
                               double max_compute_seconds = 0);

}  // namespace attnserve::engine
