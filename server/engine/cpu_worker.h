// Runs requests on the host CPU with the exact reference kernels, one request at a time (the
// kernel itself uses every core), in arrival order.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <variant>

#include "absl/time/time.h"
#include "server/engine/device_worker.h"
#include "server/engine/kernel_runner.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {

class CpuWorker : public DeviceWorker {
 public:
  // `metrics` may be null (unit tests); it must outlive the worker otherwise.
  CpuWorker(devices::DeviceDescription device, int num_threads, metrics::ServerMetrics* metrics);
  ~CpuWorker() override;

  const devices::DeviceDescription& device() const override { return device_; }
  const char* kernel_family() const override { return family_.name; }
  void Submit(ForwardJob job) override;
  void Submit(BackwardJob job) override;
  size_t QueueDepth() const override;
  void Stop() override;

 private:
  struct Queued {
    std::variant<ForwardJob, BackwardJob> job;
    absl::Time enqueued;
  };

  void Push(Queued queued);
  void Loop();
  void Execute(ForwardJob& job, absl::Time enqueued);
  void Execute(BackwardJob& job, absl::Time enqueued);
  void PublishQueueDepth(size_t depth);

  const devices::DeviceDescription device_;
  const KernelFamily family_;
  const kernels::ExecutionContext context_;
  metrics::ServerMetrics* const metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace attnserve::engine
