#include "server/engine/queue_worker.h"

namespace attnserve::engine {

QueueWorker::QueueWorker(devices::DeviceDescription device, metrics::ServerMetrics* metrics)
    : device_(std::move(device)), metrics_(metrics) {}

QueueWorker::~QueueWorker() { Stop(); }

void QueueWorker::StartThread() {
  thread_ = std::thread([this] {
    OnThreadStart();
    Loop();
  });
}

void QueueWorker::Submit(ForwardJob job) { Push({std::move(job), absl::Now()}); }
void QueueWorker::Submit(BackwardJob job) { Push({std::move(job), absl::Now()}); }

void QueueWorker::Push(Queued queued) {
  size_t depth;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(queued));
    depth = queue_.size();
  }
  PublishQueueDepth(depth);
  cv_.notify_one();
}

size_t QueueWorker::QueueDepth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void QueueWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void QueueWorker::Loop() {
  for (;;) {
    Queued queued;
    size_t depth;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      // Stop drains: accepted jobs are always answered.
      if (queue_.empty()) return;
      queued = std::move(queue_.front());
      queue_.pop_front();
      depth = queue_.size();
    }
    PublishQueueDepth(depth);
    if (auto* forward = std::get_if<ForwardJob>(&queued.job)) {
      RunAndAnswer(*forward, queued.enqueued, "Forward");
    } else {
      RunAndAnswer(std::get<BackwardJob>(queued.job), queued.enqueued, "Backward");
    }
  }
}

// Runs one job, stamps how long it waited, and answers it. The subclass fills device, kernel
// and compute time, since a job may run somewhere other than this worker's device.
template <typename Job>
void QueueWorker::RunAndAnswer(Job& job, absl::Time enqueued, const char* rpc) {
  const absl::Time start = absl::Now();
  auto result = Execute(job.inputs);
  if (result.ok()) {
    ExecutionReport& report = result->execution;
    report.queue_us = absl::ToInt64Microseconds(start - enqueued);
    report.batched_requests = 1;
    if (metrics_ != nullptr) {
      metrics_->RecordExecution(rpc, report.kernel, report.device,
                                absl::ToDoubleSeconds(start - enqueued),
                                report.compute_us * 1e-6,
                                static_cast<double>(job.inputs.q.shape[0]),
                                report.batched_requests);
    }
  }
  job.done(std::move(result));
}

void QueueWorker::PublishQueueDepth(size_t depth) {
  if (metrics_ != nullptr) metrics_->SetQueueDepth(device_.name, static_cast<double>(depth));
}

}  // namespace attnserve::engine
