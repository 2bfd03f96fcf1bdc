// One device's executor: owns its queue and threads, runs jobs on its kernel family and calls
// each job's `done`. The CPU worker is the first; CUDA workers implement the same interface.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "server/devices/device_registry.h"
#include "server/engine/engine.h"

namespace attnserve::engine {

class DeviceWorker {
 public:
  virtual ~DeviceWorker() = default;
  virtual const devices::DeviceDescription& device() const = 0;
  // Kernel families this worker runs requests on, best first.
  virtual std::vector<std::string> kernel_families() const = 0;
  // Jobs must already be validated.
  virtual void Submit(ForwardJob job) = 0;
  virtual void Submit(BackwardJob job) = 0;
  virtual size_t QueueDepth() const = 0;
  // Runs every queued job to completion, then joins the worker's threads. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace attnserve::engine
