// The part every device worker shares: a FIFO of validated jobs drained by one thread, queue
// depth published as a metric, each job timed and answered exactly once. Subclasses say how a
// job executes on their device.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <variant>

#include "absl/time/time.h"
#include "server/engine/device_worker.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {

class QueueWorker : public DeviceWorker {
 public:
  ~QueueWorker() override;

  const devices::DeviceDescription& device() const override { return device_; }
  void Submit(ForwardJob job) override;
  void Submit(BackwardJob job) override;
  size_t QueueDepth() const override;
  void Stop() override;

 protected:
  // `metrics` may be null; it must outlive the worker otherwise.
  QueueWorker(devices::DeviceDescription device, metrics::ServerMetrics* metrics);

  // Subclass constructors call this last, so the thread never sees a half-built object.
  void StartThread();

  // Called on the worker thread once, before the first job (e.g. to bind a CUDA device).
  virtual void OnThreadStart() {}
  virtual absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs) = 0;
  virtual absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs) = 0;

 private:
  struct Queued {
    std::variant<ForwardJob, BackwardJob> job;
    absl::Time enqueued;
  };

  void Push(Queued queued);
  void Loop();
  template <typename Job>
  void RunAndAnswer(Job& job, absl::Time enqueued, const char* rpc);
  void PublishQueueDepth(size_t depth);

  const devices::DeviceDescription device_;
  metrics::ServerMetrics* const metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace attnserve::engine
