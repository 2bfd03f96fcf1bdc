// The engine of one server process: validates each job, places it on the device where it would
// finish first (placement.h: routed family, queued work, memory), and counts what is in flight.
// It owns the saved contexts (context_store.h): a backward on a context is filled in from it,
// checked, and placed on the context's device; after it succeeds the context is released
// unless the backward asks to keep it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "server/engine/context_store.h"
#include "server/engine/device_worker.h"
#include "server/engine/engine.h"
#include "server/engine/engine_options.h"
#include "server/engine/placement.h"
#include "server/metrics/context_metrics.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {

class LocalEngine : public Engine {
 public:
  // One worker per device. `metrics` may be null; otherwise it must outlive the engine.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(
      const std::vector<devices::DeviceDescription>& devices, const EngineOptions& options,
      metrics::ServerMetrics* metrics);
  ~LocalEngine() override;

  absl::Status Enqueue(ForwardJob job) override;
  absl::Status Enqueue(BackwardJob job) override;
  bool Drain(absl::Duration timeout) override;
  void Stop() override;
  int64_t InflightCount() const override { return inflight_.load(); }
  bool ReleaseContext(const std::string& context_id, const std::string& principal) override;
  ContextLimits context_limits() const override;
  absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenForeignDeviceMemory(
      int device, const std::string& ipc_handle, uint64_t byte_size) override;
  HostBuffers& host_buffers() override { return *host_buffers_; }
  const Limits& limits() const override { return limits_; }
  std::vector<devices::DeviceDescription> Devices() const override;
  std::vector<std::string> KernelFamilies() const override;
  std::vector<std::string> DeviceKernelFamilies(const std::string& device) const override;
  std::vector<CoverageRow> DeviceCoverage(const std::string& device) const override;
  DeviceHealthReport DeviceHealth(const std::string& device) const override;
  bool AnyDeviceHealthy() const override;
  std::string NeedsRestart() const override;

 private:
  LocalEngine(std::unique_ptr<metrics::ContextMetrics> context_metrics,
              std::unique_ptr<ContextStore> contexts,
              std::vector<std::unique_ptr<DeviceWorker>> workers,
              std::unique_ptr<HostBuffers> host_buffers, const EngineOptions& options,
              metrics::ServerMetrics* metrics);

  // The worker of CUDA device `device` (ResidentDevice's answer) for a request whose tensors lie
  // there; none when they are host memory; FAILED_PRECONDITION when no worker serves it.
  absl::StatusOr<std::optional<size_t>> ResidentWorker(const absl::StatusOr<int>& device) const;
  // Places the job among all devices, or only on `only_device` (an index into workers_).
  template <typename Job>
  absl::Status Admit(Job job, const RequestProfile& profile, std::optional<size_t> only_device);
  struct Choice {
    DeviceWorker* worker = nullptr;
    Placement placement;
  };
  // The device (in service) the request goes to, or why none; under admit_mu_.
  absl::StatusOr<Choice> ChooseLocked(const RequestProfile& profile,
                                      std::optional<size_t> only_device);
  // A job taken off a device that faulted: placed on another device in service, else answered
  // UNAVAILABLE (a backward on a context that was in the faulted device's memory: NOT_FOUND,
  // so the client resends it in full).
  void Reroute(EvictedJob evicted);
  template <typename Job>
  void Resubmit(Job job);
  // Fills a backward on a context in from it and holds the context in the job.
  absl::Status ResolveContext(BackwardJob& job);
  // Replaces a dropout forward's seed 0 by a picked one and makes its answer report the seed.
  static void ResolveDropoutSeed(ForwardJob& job);
  absl::Status Reject(absl::Status status, const char* reason);
  std::vector<DeviceState> DeviceStates() const;
  void AddInflight(int64_t delta);

  // Before the workers: they use the store until they stop, and contexts outlive them.
  const std::unique_ptr<metrics::ContextMetrics> context_metrics_;
  const std::unique_ptr<ContextStore> contexts_;
  const std::vector<std::unique_ptr<DeviceWorker>> workers_;
  const std::unique_ptr<HostBuffers> host_buffers_;
  const Limits limits_;
  const int64_t max_queue_size_;
  // Threads the reference kernels give one request on the host (--cpu_threads, 0 resolved).
  const int host_threads_;
  metrics::ServerMetrics* const metrics_;
  std::atomic<int64_t> inflight_{0};
  // Held while submitting so a stop cannot slip between the stopping check and the submit;
  // also guards the idle signal Drain waits for.
  std::mutex admit_mu_;
  std::condition_variable idle_cv_;
  bool stopping_ = false;
};

}  // namespace attnserve::engine
