// One device's executor: owns its queue and threads, runs jobs on its kernel family and calls
// each job's `done`. The CPU worker is the first; CUDA workers implement the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "server/devices/device_registry.h"
#include "server/engine/device_health.h"
#include "server/engine/engine.h"
#include "server/engine/kernel_routing.h"

namespace attnserve::engine {

// What the engine estimated for a job when it placed it (placement.h).
struct JobCost {
  int64_t device_bytes = 0;  // reserved from the device's memory budget while the job runs
  double seconds = 0;        // estimated run time: queued work until the job is answered
};

// A worker's load as placement reads it.
struct WorkerLoad {
  size_t queue_depth = 0;      // jobs waiting (not running)
  double queued_seconds = 0;   // estimated seconds of the jobs waiting and running
  int64_t reserved_bytes = 0;  // memory held by running jobs
};

// A job taken off a device that faulted, for the engine to place elsewhere (its `done` still
// owed an answer).
using EvictedJob = std::variant<ForwardJob, BackwardJob>;

class DeviceWorker {
 public:
  virtual ~DeviceWorker() = default;
  virtual const devices::DeviceDescription& device() const = 0;
  // Kernel families this worker runs requests on, best first.
  virtual std::vector<std::string> kernel_families() const = 0;
  // What each of those families serves on this device, best first (ServerInfo lists it).
  virtual std::vector<CoverageRow> coverage() const = 0;
  // The families the routing table may pick from for this worker's device.
  virtual KernelCatalog catalog() const = 0;
  // Bytes of memory running jobs may hold at once; 0 = unbounded.
  virtual int64_t memory_budget() const = 0;
  // Jobs must already be validated and their cost must fit memory_budget().
  virtual void Submit(ForwardJob job, JobCost cost) = 0;
  virtual void Submit(BackwardJob job, JobCost cost) = 0;
  virtual WorkerLoad Load() const = 0;
  size_t QueueDepth() const { return Load().queue_depth; }
  // Whether the device serves (device_health.h); placement passes over one that does not.
  virtual DeviceHealthReport Health() const { return {}; }
  // Engine::OpenForeignDeviceMemory on this device: only CUDA workers open IPC handles.
  virtual absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenForeignMemory(
      const std::string& /*ipc_handle*/, uint64_t /*byte_size*/) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA shared memory: ", device().name, " is not a CUDA device"));
  }
  // Where the jobs queued on this device go when it faults; unset, they are answered
  // UNAVAILABLE. Set before the first Submit.
  virtual void SetEvictionHandler(std::function<void(EvictedJob)> /*handler*/) {}
  // Runs every queued job to completion, then joins the worker's threads. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace attnserve::engine
