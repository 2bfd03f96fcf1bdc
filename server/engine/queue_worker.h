// The part every device worker shares: a queue of validated jobs drained by one or more lanes
// (threads; a GPU worker gives each its own stream, so one lane's copies overlap another's
// kernels) that form batches of compatible jobs (up to a token budget, waiting up to a maximum queue delay
// for company), drops jobs whose deadline passed or whose caller left, and answers each job
// exactly once. Subclasses say how one (merged) request executes on their device.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "server/engine/device_worker.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {

struct BatchingOptions {
  bool enabled = false;  // see the --batching flag
  // Most query (and, separately, key) tokens one launch may carry.
  int64_t max_batch_tokens = 1 << 16;
  // How long the oldest job may wait for compatible company (Triton's
  // max_queue_delay_microseconds); 0 merges only what is already queued.
  absl::Duration max_queue_delay = absl::ZeroDuration();
};

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
  QueueWorker(devices::DeviceDescription device, BatchingOptions batching,
              metrics::ServerMetrics* metrics);

  // Subclass constructors call this last, so no lane sees a half-built object.
  void StartLanes(int lanes);

  // Called on each lane's thread once, before its first job (e.g. to bind a CUDA device).
  virtual void OnLaneStart(int /*lane*/) {}
  // One request, possibly the merge of several, on lane `lane` (lanes run concurrently).
  // Results carry kernel, device and compute time.
  virtual absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) = 0;
  virtual absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) = 0;

 private:
  using AnyJob = std::variant<ForwardJob, BackwardJob>;
  struct Queued {
    AnyJob job;
    absl::Time enqueued;
  };

  void Push(Queued queued);
  void Loop(int lane);
  // Blocks for the next batch (jobs of one kind, mutually compatible); empty once stopped.
  std::vector<Queued> NextBatch();
  // Takes queued jobs compatible with `batch[0]` while the token budget allows.
  void TakeCompatible(std::vector<Queued>& batch, int64_t& q_tokens, int64_t& k_tokens);
  // Answers and removes jobs whose deadline passed or whose caller cancelled.
  void DropDeadJobs(std::vector<Queued>& batch);
  template <typename Job>
  void RunBatch(std::vector<Queued>& batch, const char* rpc, int lane);
  void PublishQueueDepth(size_t depth);

  const devices::DeviceDescription device_;
  const BatchingOptions batching_;
  metrics::ServerMetrics* const metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  bool stopping_ = false;
  std::vector<std::thread> lanes_;
};

}  // namespace attnserve::engine
