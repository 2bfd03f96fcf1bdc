#include "server/engine/cpu_worker.h"

#include "kernels/reference/reference_attention.h"

namespace attnserve::engine {
namespace {

constexpr KernelFamily kReferenceFamily = {"reference", kernels::reference::Forward,
                                           kernels::reference::Backward};

// Runs one job on the family, stamps where and how long it ran, and answers it.
template <typename Job, typename RunFn>
void RunAndAnswer(Job& job, absl::Time enqueued, const devices::DeviceDescription& device,
                  const char* rpc, int64_t tokens, metrics::ServerMetrics* metrics, RunFn run) {
  const absl::Time start = absl::Now();
  auto result = run();
  const absl::Time end = absl::Now();
  if (result.ok()) {
    ExecutionReport& report = result->execution;
    report.device = device.name;
    report.queue_us = absl::ToInt64Microseconds(start - enqueued);
    report.compute_us = absl::ToInt64Microseconds(end - start);
    report.batched_requests = 1;
    if (metrics != nullptr) {
      metrics->RecordExecution(rpc, report.kernel, device.name,
                               absl::ToDoubleSeconds(start - enqueued),
                               absl::ToDoubleSeconds(end - start), static_cast<double>(tokens),
                               report.batched_requests);
    }
  }
  job.done(std::move(result));
}

}  // namespace

CpuWorker::CpuWorker(devices::DeviceDescription device, int num_threads,
                     metrics::ServerMetrics* metrics)
    : device_(std::move(device)),
      family_(kReferenceFamily),
      context_{num_threads},
      metrics_(metrics),
      thread_([this] { Loop(); }) {}

CpuWorker::~CpuWorker() { Stop(); }

void CpuWorker::Submit(ForwardJob job) { Push({std::move(job), absl::Now()}); }
void CpuWorker::Submit(BackwardJob job) { Push({std::move(job), absl::Now()}); }

void CpuWorker::Push(Queued queued) {
  size_t depth;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(queued));
    depth = queue_.size();
  }
  PublishQueueDepth(depth);
  cv_.notify_one();
}

size_t CpuWorker::QueueDepth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void CpuWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CpuWorker::Loop() {
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
    std::visit([&](auto& job) { Execute(job, queued.enqueued); }, queued.job);
  }
}

void CpuWorker::Execute(ForwardJob& job, absl::Time enqueued) {
  RunAndAnswer(job, enqueued, device_, "Forward", job.inputs.q.shape[0], metrics_,
               [&] { return RunForward(family_, job.inputs, context_); });
}

void CpuWorker::Execute(BackwardJob& job, absl::Time enqueued) {
  RunAndAnswer(job, enqueued, device_, "Backward", job.inputs.q.shape[0], metrics_,
               [&] { return RunBackward(family_, job.inputs, context_); });
}

void CpuWorker::PublishQueueDepth(size_t depth) {
  if (metrics_ != nullptr) metrics_->SetQueueDepth(device_.name, static_cast<double>(depth));
}

}  // namespace attnserve::engine
