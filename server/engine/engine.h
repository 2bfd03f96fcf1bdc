// The one narrow interface transports use (Triton's split): hand over a job, stop, count what
// is in flight. Scheduling, validation and execution all live behind it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/devices/device_registry.h"
#include "server/engine/attention_request.h"
#include "server/engine/foreign_device_memory.h"
#include "server/engine/host_buffers.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/limits.h"
#include "server/engine/priority.h"
#include "server/engine/saved_context.h"

namespace attnserve::engine {

// What the caller says about a job beyond its inputs: when it stops being useful, how to learn
// that the caller has gone (a queued job past either is dropped without running), and how
// urgent it is.
struct JobControl {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // empty: never cancelled
  Priority priority = Priority::kNormal;
  // Who calls (a digest of its credentials; empty without authentication). Contexts it keeps
  // are its own: to any other principal they do not exist.
  std::string principal;
};

// The request's input views must stay valid until `done` has returned.
struct ForwardJob {
  ForwardInputs inputs;
  std::function<void(absl::StatusOr<ForwardResult>)> done;
  JobControl control;
};

struct BackwardJob {
  BackwardInputs inputs;
  std::function<void(absl::StatusOr<BackwardResult>)> done;
  JobControl control;
  // Set by the engine when inputs.context_id names a context: the job holds it until answered.
  std::shared_ptr<const SavedContext> context;
};

// What ServerInfo reports about saved contexts.
struct ContextLimits {
  int64_t memory_bytes = 0;  // the smallest device's context budget
  absl::Duration ttl = absl::ZeroDuration();
};

// Whether a device serves requests (device_health.h).
struct DeviceHealthReport {
  bool healthy = true;
  std::string fault;  // what took it out of service (a device fault); empty while healthy
  // Resets tried since the fault that all failed, and why the last one did.
  int failed_resets = 0;
  std::string reset_error;
};

// Failed resets after which a device counts as lost to this process: on the GPU machine a
// sticky error (a trapped kernel) survived cudaDeviceReset every time, so only a new process
// brings the GPU back.
inline constexpr int kFailedResetsBeforeRestart = 3;

class Engine {
 public:
  virtual ~Engine() = default;

  // Validates and queues the job. On OK, `done` is called exactly once, later, from a worker
  // thread. On error (invalid request, limits, shutting down) `done` is never called and the
  // caller answers with the returned status.
  virtual absl::Status Enqueue(ForwardJob job) = 0;
  virtual absl::Status Enqueue(BackwardJob job) = 0;

  // Stops accepting jobs (Enqueue answers UNAVAILABLE from now on) and waits up to `timeout`
  // for the accepted ones to be answered. Returns whether everything was answered in time.
  virtual bool Drain(absl::Duration timeout) = 0;

  // Stops accepting jobs, finishes every accepted one, then joins the workers. Idempotent.
  virtual void Stop() = 0;

  // Jobs accepted and not yet answered.
  virtual int64_t InflightCount() const = 0;

  // Frees `principal`'s saved context `context_id`; false when it holds none by that id.
  virtual bool ReleaseContext(const std::string& /*context_id*/,
                              const std::string& /*principal*/) {
    return false;
  }
  virtual ContextLimits context_limits() const { return {}; }
  // Opens device memory a co-located client exported (the 64 bytes of its cudaIpcMemHandle_t),
  // at least `byte_size` bytes of it, on the CUDA device of ordinal `device`, for requests whose
  // tensors lie there (TensorView::device). FAILED_PRECONDITION where no CUDA device of that
  // ordinal is served; INVALID_ARGUMENT for a handle that does not open or is too small.
  virtual absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenForeignDeviceMemory(
      int device, const std::string& /*ipc_handle*/, uint64_t /*byte_size*/) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA shared memory: this server serves no CUDA device ", device));
  }

  // Where a transport that receives request bytes itself puts them (page-locked on GPU hosts,
  // so they cross PCIe without staging). Buffers may outlive the engine's other uses but not
  // the engine.
  virtual HostBuffers& host_buffers() = 0;

  virtual const Limits& limits() const = 0;
  virtual std::vector<devices::DeviceDescription> Devices() const = 0;
  virtual std::vector<std::string> KernelFamilies() const = 0;
  // Per device (by name): the families it runs and what each serves, best first.
  virtual std::vector<std::string> DeviceKernelFamilies(const std::string& /*device*/) const {
    return KernelFamilies();
  }
  virtual std::vector<CoverageRow> DeviceCoverage(const std::string& /*device*/) const {
    return {};
  }
  virtual DeviceHealthReport DeviceHealth(const std::string& /*device*/) const { return {}; }
  // Whether some device serves: readiness fails while every one is out of service.
  virtual bool AnyDeviceHealthy() const { return true; }
  // Non-empty when no device serves and none could be reset kFailedResetsBeforeRestart times
  // in a row: why the process should be restarted (liveness fails with it).
  virtual std::string NeedsRestart() const { return ""; }
};

}  // namespace attnserve::engine
