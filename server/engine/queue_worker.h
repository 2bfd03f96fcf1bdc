// The part every device worker shares: a queue of validated jobs drained by one or more lanes
// (threads; a GPU worker gives each its own stream, so one lane's copies overlap another's
// kernels). A lane takes the job of the best priority (priority.h: aged, then oldest first),
// waits while the device's memory budget cannot hold it next to the running jobs, and with
// batching on adds compatible jobs (up to a token budget and an equal share of the backlog per
// idle lane, waiting up to a maximum queue delay for company). Jobs whose deadline passed or whose
// caller left are dropped, and every job is answered exactly once. Results are handed to answer
// threads (answer_pool.h), so a lane does not wait for its answers to be serialized before its
// next launch. Subclasses say how a request (or a batch of them) executes on their device.
// Saved-context jobs (a keep_context forward, a backward on a context) always run alone, and
// the contexts a device holds count against its memory budget beside the running jobs.
// A device fault in a launch (device_fault.h) takes the device out of service: the launch's
// requests are answered UNAVAILABLE, queued jobs go to the eviction handler, lanes take no
// jobs, and the lane that saw it resets the device once the others are idle (retrying with a
// doubling interval) before the device serves again.
#pragma once

#include <condition_variable>
#include <functional>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "server/engine/answer_pool.h"
#include "server/engine/context_store.h"
#include "server/engine/device_health.h"
#include "server/engine/device_worker.h"
#include "server/engine/engine_options.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {

class QueueWorker : public DeviceWorker {
 public:
  ~QueueWorker() override;

  const devices::DeviceDescription& device() const override { return device_; }
  int64_t memory_budget() const override { return memory_budget_; }
  void Submit(ForwardJob job, JobCost cost) override;
  void Submit(BackwardJob job, JobCost cost) override;
  WorkerLoad Load() const override;
  DeviceHealthReport Health() const override { return health_.Report(); }
  void SetEvictionHandler(std::function<void(EvictedJob)> handler) override;
  void Stop() override;

 protected:
  // `metrics` and `contexts` may be null (then no context is kept); they must outlive the
  // worker otherwise.
  QueueWorker(devices::DeviceDescription device, const EngineOptions& options,
              metrics::ServerMetrics* metrics, ContextStore* contexts = nullptr);

  // Subclass constructors call this last, so no lane sees a half-built object.
  void StartLanes(int lanes);
  // While lane `lane` runs a launch: true once every request in it has passed its deadline or
  // been cancelled by its caller, for ExecutionContext::should_stop. Safe from any thread.
  const std::function<bool()>& LaneStop(int lane) const { return lane_stops_[lane]; }

  // Called on each lane's thread once, before its first job (e.g. to bind a CUDA device).
  virtual void OnLaneStart(int /*lane*/) {}
  // The launch --inject_device_fault makes fail: a device fault (a GPU worker traps a real
  // kernel on the lane's stream).
  virtual absl::Status InjectFault(int lane);
  // Resets the device after a fault; called with no lane running anything. OK: it serves
  // again. The host CPU has nothing to reset.
  virtual absl::Status ResetDevice() { return absl::OkStatus(); }
  // One request on lane `lane` (lanes run concurrently). Results carry kernel, device and
  // compute time.
  virtual absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) = 0;
  virtual absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) = 0;
  // One or more compatible requests as one launch, each answered with its own share. The
  // default runs a single part through Execute, and merges several into one request for
  // Execute and splits its result; a worker that can stage parts straight into its device
  // buffers overrides it.
  virtual std::vector<absl::StatusOr<ForwardResult>> ExecuteBatch(
      const std::vector<const ForwardInputs*>& parts, int lane);
  virtual std::vector<absl::StatusOr<BackwardResult>> ExecuteBatch(
      const std::vector<const BackwardInputs*>& parts, int lane);
  // A keep_context forward: its result, and in `kept` its context's memory (q, k, v, out,
  // lse, offsets), or null when it cannot be kept (the forward is answered all the same). The
  // default keeps host copies.
  virtual absl::StatusOr<ForwardResult> ExecuteKeeping(const ForwardInputs& inputs, int lane,
                                                       std::unique_ptr<ContextMemory>* kept);
  // A backward on `context`; `inputs` were filled from it (FillFromContext). The default runs
  // Execute, which reads a host context through the filled views.
  virtual absl::StatusOr<BackwardResult> ExecuteOnContext(const BackwardInputs& inputs,
                                                          const SavedContext& context, int lane);

 private:
  using AnyJob = std::variant<ForwardJob, BackwardJob>;
  struct Queued {
    AnyJob job;
    JobCost cost;
    absl::Time enqueued;
    bool waited_for_memory = false;
  };

  // Routes a job submitted without a route (straight to the worker, in tests) once, as
  // placement would have on this device; a routed job keeps its route.
  template <typename Inputs>
  void RouteIfUndecided(Inputs& inputs) const;
  void Push(Queued queued);
  void Loop(int lane);
  // Blocks for the next batch (jobs of one kind, mutually compatible, their memory reserved);
  // empty once stopped with nothing left.
  std::vector<Queued> NextBatch();
  // The queued job that launches next: best effective priority, then oldest.
  std::deque<Queued>::iterator PickNextLocked(absl::Time now);
  bool FitsLocked(int64_t bytes) const;
  // Moves compatible queued jobs into `batch` while the token budget, the memory budget and
  // this lane's share of the backlog allow, reserving their memory.
  void TakeCompatibleLocked(std::vector<Queued>& batch, int64_t& q_tokens, int64_t& k_tokens);
  // Takes jobs whose deadline passed or whose caller cancelled out of the queue (out of the
  // batch for DropDeadJobs), to be answered outside the lock.
  std::vector<Queued> ReapLocked(absl::Time now);
  void DropDeadJobs(std::vector<Queued>& batch);
  void AnswerDropped(std::vector<Queued>& dropped, absl::Time now);
  absl::Time EarliestDeadlineLocked() const;
  // Forgets an answered job's estimate and releases its reservation.
  void FinishLocked(const Queued& queued, bool reserved);
  template <typename Job>
  void RunBatch(std::vector<Queued>& batch, const char* rpc, int lane);
  // ExecuteBatch, or the context paths for a context job (always alone in its batch).
  std::vector<absl::StatusOr<ForwardResult>> Launch(
      const std::vector<Queued>& batch, const std::vector<const ForwardInputs*>& parts, int lane);
  std::vector<absl::StatusOr<BackwardResult>> Launch(
      const std::vector<Queued>& batch, const std::vector<const BackwardInputs*>& parts,
      int lane);
  // Calls `done` with `answer` on an answer thread and records how long that took from now.
  template <typename Done, typename Answer>
  void Deliver(Done done, Answer answer);
  void PublishLoad();
  // A launch's answers; on a device fault among them, takes the device out of service and
  // hands its queue to the eviction handler. Returns whether the device faulted.
  template <typename Answers>
  bool CheckForFault(const Answers& answers);
  // On the lane that saw the fault: waits for the other lanes' launches, then resets the
  // device until a reset succeeds (or the worker stops).
  void RecoverDevice();
  // Hands jobs to the eviction handler when `reroute` (and one is set), else answers them
  // UNAVAILABLE on an answer thread.
  void Evict(std::vector<Queued> jobs, const std::string& why, bool reroute);

  const devices::DeviceDescription device_;
  const BatchingOptions batching_;
  const int64_t memory_budget_;
  const absl::Duration priority_aging_;
  const int answer_threads_per_lane_;
  metrics::ServerMetrics* const metrics_;
  ContextStore* const contexts_;
  const absl::Duration reset_interval_;
  DeviceHealth health_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  double queued_seconds_ = 0;  // estimates of queued and running jobs
  int64_t reserved_bytes_ = 0;
  int64_t running_jobs_ = 0;
  bool stopping_ = false;
  int lane_count_ = 1;  // set before the lanes start
  int idle_lanes_ = 0;  // lanes not running a batch
  int memory_waiters_ = 0;  // lanes waiting for running jobs to free device memory
  bool recovering_ = false;  // a lane is resetting the device after a fault
  std::function<void(EvictedJob)> eviction_handler_;
  std::vector<std::thread> lanes_;
  std::vector<std::function<bool()>> lane_stops_;  // each written and read by its lane only
  // answer_threads_per_lane_ threads per lane; stopped after the lanes, so it delivers every
  // answer they post.
  std::unique_ptr<AnswerPool> answers_;
};

}  // namespace attnserve::engine
