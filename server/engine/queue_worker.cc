#include "server/engine/queue_worker.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "server/engine/batching.h"
#include "server/engine/device_fault.h"
#include "server/engine/placement.h"
#include "server/engine/request_cost.h"
#include "server/engine/resident_device.h"

namespace attnserve::engine {
namespace {

// The code path that ran a job routed to `route`, given the family that reports running it:
// the route's, unless the worker answered on the host instead (an empty request, which needs
// no device, is answered by the reference).
std::string CodePathRun(const Route& route, const std::string& kernel) {
  if (kernel == route.family) return route.Name();
  if (kernel == "reference") return "reference/cpu";
  return kernel;
}

// A lane waiting for memory also wakes this often to notice callers that left.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);
// Resets of a faulted device are retried at most this far apart.
constexpr absl::Duration kMaxDeviceResetInterval = absl::Seconds(60);

InjectedFault InjectedFaultOn(const std::string& device, const EngineOptions& options) {
  auto it = options.injected_faults.find(device);
  return it == options.injected_faults.end() ? InjectedFault{} : it->second;
}

template <typename Job>
const auto& InputsOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::get<Job>(job).inputs;
}

// Saved-context jobs run alone: a kept forward's launch buffer becomes its context, and a
// backward on a context reads its tensors where they lie.
// So do jobs whose inputs are still arriving: nothing may read them whole before they are in.
// So do jobs whose tensors lie in a device's memory: they are read where they are.
bool UsesContext(const std::variant<ForwardJob, BackwardJob>& job) {
  if (const auto* forward = std::get_if<ForwardJob>(&job)) {
    return forward->inputs.keep_context || forward->inputs.groups != nullptr ||
           IsResident(forward->inputs);
  }
  const BackwardJob& backward = std::get<BackwardJob>(job);
  return backward.context != nullptr || backward.inputs.groups != nullptr ||
         IsResident(backward.inputs);
}

bool SameKindAndCompatible(const std::variant<ForwardJob, BackwardJob>& a,
                           const std::variant<ForwardJob, BackwardJob>& b) {
  if (a.index() != b.index() || UsesContext(a) || UsesContext(b)) return false;
  if (a.index() == 0) return Compatible(InputsOf<ForwardJob>(a), InputsOf<ForwardJob>(b));
  return Compatible(InputsOf<BackwardJob>(a), InputsOf<BackwardJob>(b));
}

int64_t QueryTokensOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::visit([](const auto& j) { return QueryTokens(j.inputs); }, job);
}
int64_t KeyTokensOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::visit([](const auto& j) { return KeyTokens(j.inputs); }, job);
}
const JobControl& ControlOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::visit([](const auto& j) -> const JobControl& { return j.control; }, job);
}

// Why a job must not run any more, or OK.
absl::Status DeadStatus(const JobControl& control, absl::Time enqueued, absl::Time now,
                        const std::string& device) {
  // Deadline first: a transport may also report an expired call as cancelled.
  if (now >= control.deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline passed after ", absl::FormatDuration(now - enqueued),
                     " in the queue of ", device, "; the request did not run"));
  }
  if (control.cancelled && control.cancelled()) {
    return absl::CancelledError("the caller cancelled the request before it ran");
  }
  return absl::OkStatus();
}

int64_t MemoryBudget(const devices::DeviceDescription& device, const EngineOptions& options) {
  if (options.device_memory_bytes <= 0) return device.memory_total_bytes;
  if (device.memory_total_bytes <= 0) return options.device_memory_bytes;
  return std::min(options.device_memory_bytes, device.memory_total_bytes);
}

template <typename Inputs, typename Merged, typename Result>
std::vector<absl::StatusOr<Result>> MergeRunSplit(
    const std::vector<const Inputs*>& parts, Merged (*merge)(const std::vector<const Inputs*>&),
    std::vector<Result> (*split)(const Result&, const BatchLayout&),
    const std::function<absl::StatusOr<Result>(const Inputs&)>& execute) {
  std::vector<absl::StatusOr<Result>> answers;
  if (parts.size() == 1) {
    answers.push_back(execute(*parts[0]));
    return answers;
  }
  Merged merged = merge(parts);
  absl::StatusOr<Result> result = execute(merged.inputs);
  if (!result.ok()) {
    answers.assign(parts.size(), result.status());
    return answers;
  }
  for (Result& share : split(*result, merged.layout)) answers.push_back(std::move(share));
  return answers;
}

}  // namespace

QueueWorker::QueueWorker(devices::DeviceDescription device, const EngineOptions& options,
                         metrics::ServerMetrics* metrics, ContextStore* contexts)
    : device_(std::move(device)),
      batching_(options.batching),
      memory_budget_(MemoryBudget(device_, options)),
      priority_aging_(options.priority_aging > absl::ZeroDuration() ? options.priority_aging
                                                                     : absl::Milliseconds(1)),
      answer_threads_per_lane_(std::max(1, options.answer_threads_per_lane)),
      metrics_(metrics),
      contexts_(contexts),
      reset_interval_(std::max(options.device_reset_interval, absl::Milliseconds(1))),
      health_(device_.name, InjectedFaultOn(device_.name, options), metrics) {}

QueueWorker::~QueueWorker() { Stop(); }

void QueueWorker::StartLanes(int lanes) {
  lane_count_ = std::max(1, lanes);
  lane_stops_.resize(lane_count_);
  answers_ = std::make_unique<AnswerPool>(lane_count_ * answer_threads_per_lane_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle_lanes_ = lane_count_;
  }
  for (int lane = 0; lane < lanes; ++lane) {
    lanes_.emplace_back([this, lane] {
      OnLaneStart(lane);
      Loop(lane);
    });
  }
}

template <typename Inputs>
void QueueWorker::RouteIfUndecided(Inputs& inputs) const {
  if (inputs.route.decided()) return;
  inputs.route = RouteOn(ProfileOf(inputs), RoutingStateOf(device_, catalog()));
}

void QueueWorker::Submit(ForwardJob job, JobCost cost) {
  RouteIfUndecided(job.inputs);
  Push({std::move(job), cost, absl::Now()});
}
void QueueWorker::Submit(BackwardJob job, JobCost cost) {
  RouteIfUndecided(job.inputs);
  Push({std::move(job), cost, absl::Now()});
}

void QueueWorker::SetEvictionHandler(std::function<void(EvictedJob)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  eviction_handler_ = std::move(handler);
}

void QueueWorker::Push(Queued queued) {
  bool wake_all;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Placement passes over a device out of service; a job placed just before the fault (or
    // after a stop, which the engine never does) is answered at once, retryably.
    const DeviceHealthReport health = health_.Report();
    if (stopping_ || !health.healthy) {
      lock.unlock();
      std::vector<Queued> refused;
      refused.push_back(std::move(queued));
      // Answered on an answer thread: the engine calls Submit holding its admission lock,
      // which a `done` may take.
      Evict(std::move(refused), stopping_ ? "it is stopping" : health.fault, /*reroute=*/false);
      return;
    }
    queued_seconds_ += queued.cost.seconds;
    queue_.push_back(std::move(queued));
    // One idle lane takes a new job; every lane must look when one may be gathering a batch
    // or waiting for memory ahead of it. Waking every lane per job cost small requests.
    wake_all = batching_.enabled || memory_waiters_ > 0;
  }
  PublishLoad();
  if (wake_all) {
    cv_.notify_all();
  } else {
    cv_.notify_one();
  }
}

WorkerLoad QueueWorker::Load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {queue_.size(), queued_seconds_, reserved_bytes_};
}

void QueueWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& lane : lanes_) {
    if (lane.joinable()) lane.join();
  }
  answers_.reset();  // delivers what the lanes posted, then joins
}

void QueueWorker::Loop(int lane) {
  for (;;) {
    std::vector<Queued> batch = NextBatch();
    if (batch.empty()) return;  // stopped with nothing left: accepted jobs are all answered
    PublishLoad();  // its memory is reserved now: the gauges show it running
    DropDeadJobs(batch);
    if (batch.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++idle_lanes_;
      continue;
    }
    if (std::holds_alternative<ForwardJob>(batch[0].job)) {
      RunBatch<ForwardJob>(batch, "Forward", lane);
    } else {
      RunBatch<BackwardJob>(batch, "Backward", lane);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++idle_lanes_;
  }
}

std::vector<QueueWorker::Queued> QueueWorker::NextBatch() {
  std::vector<Queued> batch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const absl::Time now = absl::Now();
    std::vector<Queued> dropped = ReapLocked(now);
    if (!dropped.empty()) {
      lock.unlock();
      AnswerDropped(dropped, now);
      lock.lock();
      continue;
    }
    if (queue_.empty() || !health_.healthy()) {
      // Out of service: the queue went elsewhere, and nothing runs until the device is reset.
      if (stopping_ && queue_.empty()) return batch;  // empty: the lane ends
      cv_.wait(lock);
      continue;
    }
    auto next = PickNextLocked(now);
    if (!FitsLocked(next->cost.device_bytes)) {
      // It fits the budget (admission checked) but not beside the running jobs: it waits, and
      // so does everything behind it, so a large job is never starved by smaller ones.
      if (!next->waited_for_memory) {
        next->waited_for_memory = true;
        if (metrics_ != nullptr) metrics_->RecordMemoryWait(device_.name);
      }
      const absl::Time wake = std::min(EarliestDeadlineLocked(), now + kCancelPoll);
      ++memory_waiters_;
      cv_.wait_until(lock, absl::ToChronoTime(wake));
      --memory_waiters_;
      continue;
    }
    reserved_bytes_ += next->cost.device_bytes;
    ++running_jobs_;
    batch.push_back(std::move(*next));
    queue_.erase(next);
    break;
  }
  if (batching_.enabled && !UsesContext(batch[0].job)) {
    int64_t q_tokens = QueryTokensOf(batch[0].job), k_tokens = KeyTokensOf(batch[0].job);
    const absl::Time wait_until = batch[0].enqueued + batching_.max_queue_delay;
    for (;;) {
      TakeCompatibleLocked(batch, q_tokens, k_tokens);
      if (stopping_ || absl::Now() >= wait_until) break;
      cv_.wait_until(lock, absl::ToChronoTime(wait_until));
    }
  }
  --idle_lanes_;
  lock.unlock();
  PublishLoad();
  return batch;
}

std::deque<QueueWorker::Queued>::iterator QueueWorker::PickNextLocked(absl::Time now) {
  auto best = queue_.begin();
  int best_level = EffectiveLevel(ControlOf(best->job).priority, now - best->enqueued,
                                  priority_aging_);
  // The queue is in arrival order, so the first job of the best level is the oldest of it.
  for (auto it = std::next(queue_.begin()); it != queue_.end() && best_level > 0; ++it) {
    const int level =
        EffectiveLevel(ControlOf(it->job).priority, now - it->enqueued, priority_aging_);
    if (level < best_level) {
      best = it;
      best_level = level;
    }
  }
  return best;
}

bool QueueWorker::FitsLocked(int64_t bytes) const {
  // With nothing running a job always starts: admission made sure it fits the budget alone.
  if (memory_budget_ <= 0 || reserved_bytes_ == 0) return true;
  const int64_t contexts = contexts_ != nullptr ? contexts_->BytesOn(device_.name) : 0;
  return contexts + reserved_bytes_ + bytes <= memory_budget_;
}

void QueueWorker::TakeCompatibleLocked(std::vector<Queued>& batch, int64_t& q_tokens,
                                       int64_t& k_tokens) {
  // Each idle lane (this one included) takes an equal share of the compatible backlog, so a
  // backlog is spread over the lanes (one staging while another computes) instead of being
  // serialized through one; a lane that frees up while the others are busy takes it all.
  size_t compatible = 0;
  for (const Queued& queued : queue_) compatible += SameKindAndCompatible(batch[0].job, queued.job);
  const size_t lanes = static_cast<size_t>(std::max(1, idle_lanes_));
  const size_t share = (batch.size() + compatible + lanes - 1) / lanes;
  for (auto it = queue_.begin(); it != queue_.end() && batch.size() < share;) {
    const int64_t q = QueryTokensOf(it->job), k = KeyTokensOf(it->job);
    if (SameKindAndCompatible(batch[0].job, it->job) &&
        q_tokens + q <= batching_.max_batch_tokens && k_tokens + k <= batching_.max_batch_tokens &&
        FitsLocked(it->cost.device_bytes)) {
      q_tokens += q;
      k_tokens += k;
      reserved_bytes_ += it->cost.device_bytes;
      ++running_jobs_;
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<QueueWorker::Queued> QueueWorker::ReapLocked(absl::Time now) {
  std::vector<Queued> dropped;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (DeadStatus(ControlOf(it->job), it->enqueued, now, device_.name).ok()) {
      ++it;
      continue;
    }
    FinishLocked(*it, /*reserved=*/false);
    dropped.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  return dropped;
}

void QueueWorker::DropDeadJobs(std::vector<Queued>& batch) {
  const absl::Time now = absl::Now();
  std::vector<Queued> alive, dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Queued& queued : batch) {
      if (DeadStatus(ControlOf(queued.job), queued.enqueued, now, device_.name).ok()) {
        alive.push_back(std::move(queued));
      } else {
        FinishLocked(queued, /*reserved=*/true);
        dropped.push_back(std::move(queued));
      }
    }
  }
  batch = std::move(alive);
  if (!dropped.empty()) {
    cv_.notify_all();  // their memory is free again
    AnswerDropped(dropped, now);
  }
}

void QueueWorker::AnswerDropped(std::vector<Queued>& dropped, absl::Time now) {
  PublishLoad();
  for (Queued& queued : dropped) {
    std::visit(
        [&](auto& job) { job.done(DeadStatus(job.control, queued.enqueued, now, device_.name)); },
        queued.job);
  }
}

absl::Time QueueWorker::EarliestDeadlineLocked() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (const Queued& queued : queue_) earliest = std::min(earliest, ControlOf(queued.job).deadline);
  return earliest;
}

void QueueWorker::FinishLocked(const Queued& queued, bool reserved) {
  if (reserved) {
    reserved_bytes_ -= queued.cost.device_bytes;
    --running_jobs_;
  }
  queued_seconds_ -= queued.cost.seconds;
  // Estimates are doubles added and taken away in different orders: snap to zero when idle.
  if (queue_.empty() && running_jobs_ == 0) queued_seconds_ = 0;
}

std::vector<absl::StatusOr<ForwardResult>> QueueWorker::ExecuteBatch(
    const std::vector<const ForwardInputs*>& parts, int lane) {
  return MergeRunSplit<ForwardInputs, MergedForward, ForwardResult>(
      parts, MergeForward, SplitForward,
      [this, lane](const ForwardInputs& in) { return Execute(in, lane); });
}

std::vector<absl::StatusOr<BackwardResult>> QueueWorker::ExecuteBatch(
    const std::vector<const BackwardInputs*>& parts, int lane) {
  return MergeRunSplit<BackwardInputs, MergedBackward, BackwardResult>(
      parts, MergeBackward, SplitBackward,
      [this, lane](const BackwardInputs& in) { return Execute(in, lane); });
}

absl::StatusOr<ForwardResult> QueueWorker::ExecuteKeeping(const ForwardInputs& inputs, int lane,
                                                          std::unique_ptr<ContextMemory>* kept) {
  // The host context copies q after the kernel ran, and out and lse from the result's own
  // bytes: this run leaves the output space (whose out may overlay q) alone.
  ForwardInputs owning = inputs;
  owning.output_space = {};
  absl::StatusOr<ForwardResult> result = Execute(owning, lane);
  if (result.ok()) *kept = SaveOnHost(owning, *result);
  return result;
}

absl::StatusOr<BackwardResult> QueueWorker::ExecuteOnContext(const BackwardInputs& inputs,
                                                            const SavedContext& context,
                                                            int lane) {
  if (!context.memory->on_host()) {
    return absl::InternalError(absl::StrCat(device_.name, " cannot read a context in device memory"));
  }
  return Execute(inputs, lane);
}

std::vector<absl::StatusOr<ForwardResult>> QueueWorker::Launch(
    const std::vector<Queued>& batch, const std::vector<const ForwardInputs*>& parts, int lane) {
  // A forward still arriving (inputs.groups) is waited for group by group by the worker's own
  // paths: RunForward on the host, cuda_grouped_forward.h on GPUs (backwards likewise).
  const ForwardJob& job = std::get<ForwardJob>(batch[0].job);
  if (!job.inputs.keep_context || contexts_ == nullptr) return ExecuteBatch(parts, lane);
  std::unique_ptr<ContextMemory> kept;
  std::vector<absl::StatusOr<ForwardResult>> answers;
  answers.push_back(ExecuteKeeping(job.inputs, lane, &kept));
  if (answers[0].ok() && kept != nullptr) {
    auto context = std::make_unique<SavedContext>();
    context->device = device_.name;
    context->principal = job.control.principal;
    context->spec = ContextSpec::Of(job.inputs);
    context->memory = std::move(kept);
    // Not kept when it cannot fit the budget: the answer says so with an empty id.
    answers[0]->context_id = contexts_->Add(std::move(context)).value_or("");
  }
  return answers;
}

std::vector<absl::StatusOr<BackwardResult>> QueueWorker::Launch(
    const std::vector<Queued>& batch, const std::vector<const BackwardInputs*>& parts,
    int lane) {
  const BackwardJob& job = std::get<BackwardJob>(batch[0].job);
  if (job.context == nullptr) return ExecuteBatch(parts, lane);
  std::vector<absl::StatusOr<BackwardResult>> answers;
  answers.push_back(ExecuteOnContext(job.inputs, *job.context, lane));
  return answers;
}

// Runs the batch as one launch, releases its memory, then answers each job with its own share
// of the result, stamped with how long it waited.
template <typename Job>
void QueueWorker::RunBatch(std::vector<Queued>& batch, const char* rpc, int lane) {
  std::vector<const decltype(Job::inputs)*> parts;
  for (const Queued& queued : batch) parts.push_back(&std::get<Job>(queued.job).inputs);

  const absl::Time start = absl::Now();
  std::vector<const JobControl*> controls;
  for (const Queued& queued : batch) controls.push_back(&std::get<Job>(queued.job).control);
  lane_stops_[lane] = [&controls] {
    const absl::Time now = absl::Now();
    for (const JobControl* control : controls) {
      if (now < control->deadline && !(control->cancelled && control->cancelled())) return false;
    }
    return true;
  };
  decltype(Launch(batch, parts, lane)) answers;
  if (health_.CountLaunchIsInjectedFault()) {
    absl::Status fault = InjectFault(lane);
    if (!IsDeviceFault(fault)) {
      fault = DeviceFaultError(absl::StrCat("injected fault on ", device_.name,
                                            " did not fault the device: ", fault.ToString()));
    }
    answers.assign(batch.size(), fault);
  } else {
    answers = Launch(batch, parts, lane);
  }
  lane_stops_[lane] = nullptr;
  const bool faulted = CheckForFault(answers);
  for (size_t i = 0; i < answers.size() && i < controls.size(); ++i) {
    // Stopped part way (ExecutionContext::should_stop): say which of the two it was.
    if (!answers[i].ok() && answers[i].status().code() == absl::StatusCode::kCancelled &&
        absl::Now() >= controls[i]->deadline) {
      answers[i] = absl::DeadlineExceededError(absl::StrCat(
          "deadline passed while the request ran on ", device_.name, "; it was stopped after ",
          absl::FormatDuration(absl::Now() - start)));
    }
  }
  if (metrics_ != nullptr) metrics_->RecordBatch(static_cast<int>(batch.size()));
  bool memory_waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Queued& queued : batch) FinishLocked(queued, /*reserved=*/true);
    // A job waiting for memory may fit now; a lane resetting the device waits for idle lanes.
    memory_waiters = memory_waiters_ > 0 || recovering_;
  }
  if (memory_waiters) cv_.notify_all();
  PublishLoad();

  for (size_t i = 0; i < batch.size(); ++i) {
    Job& job = std::get<Job>(batch[i].job);
    auto& answer = answers[i];
    const double queue_seconds = absl::ToDoubleSeconds(start - batch[i].enqueued);
    if (metrics_ != nullptr) {
      metrics_->RecordPriorityQueueDuration(PriorityName(job.control.priority), queue_seconds);
    }
    if (answer.ok()) {
      ExecutionReport& report = answer->execution;
      report.queue_us = absl::ToInt64Microseconds(start - batch[i].enqueued);
      report.batched_requests = static_cast<int32_t>(batch.size());
      if (report.code_path.empty()) report.code_path = CodePathRun(job.inputs.route, report.kernel);
      if (metrics_ != nullptr) {
        metrics_->RecordCodePath(rpc, report.code_path, report.device, report.compute_us * 1e-6);
        metrics_->RecordExecution(rpc, report.kernel, report.device, queue_seconds,
                                  report.compute_us * 1e-6,
                                  static_cast<double>(QueryTokens(job.inputs)),
                                  AttentionFlops(job.inputs));
      }
    }
    Deliver(std::move(job.done), std::move(answer));
  }
  if (faulted) RecoverDevice();
}

absl::Status QueueWorker::InjectFault(int /*lane*/) {
  return DeviceFaultError(
      absl::StrCat(device_.name, ": injected device fault (--inject_device_fault)"));
}

template <typename Answers>
bool QueueWorker::CheckForFault(const Answers& answers) {
  for (const auto& answer : answers) {
    if (answer.ok() || !IsDeviceFault(answer.status())) continue;
    std::vector<Queued> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!health_.MarkFaulted(answer.status())) return true;  // another lane saw it first
      for (Queued& queued : queue_) {
        queued_seconds_ -= queued.cost.seconds;
        evicted.push_back(std::move(queued));
      }
      queue_.clear();
    }
    // Contexts in its memory go with the reset; clients resend them in full (NOT_FOUND).
    if (contexts_ != nullptr) contexts_->DropDevice(device_.name);
    PublishLoad();
    Evict(std::move(evicted), std::string(answer.status().message()), /*reroute=*/true);
    return true;
  }
  return false;
}

void QueueWorker::RecoverDevice() {
  std::unique_lock<std::mutex> lock(mu_);
  if (recovering_) return;
  recovering_ = true;
  // Reset only while no lane uses the device (this lane's batch is finished already).
  cv_.wait(lock, [this] { return running_jobs_ == 0 || stopping_; });
  absl::Duration interval = reset_interval_;
  while (!stopping_) {
    lock.unlock();
    const absl::Status reset = health_.RecordReset(ResetDevice());
    lock.lock();
    if (reset.ok()) break;
    cv_.wait_for(lock, absl::ToChronoNanoseconds(interval), [this] { return stopping_; });
    interval = std::min(2 * interval, kMaxDeviceResetInterval);
  }
  recovering_ = false;
  lock.unlock();
  cv_.notify_all();  // lanes take jobs again
}

void QueueWorker::Evict(std::vector<Queued> jobs, const std::string& why, bool reroute) {
  std::function<void(EvictedJob)> handler;
  if (reroute) {
    std::lock_guard<std::mutex> lock(mu_);
    handler = eviction_handler_;
  }
  for (Queued& queued : jobs) {
    if (handler) {
      handler(std::move(queued.job));
      continue;
    }
    const absl::Status unavailable = absl::UnavailableError(
        absl::StrCat(device_.name, " cannot run the request (", why, "); retry later"));
    if (auto* forward = std::get_if<ForwardJob>(&queued.job)) {
      Deliver(std::move(forward->done), absl::StatusOr<ForwardResult>(unavailable));
    } else {
      Deliver(std::move(std::get<BackwardJob>(queued.job).done),
              absl::StatusOr<BackwardResult>(unavailable));
    }
  }
}

template <typename Done, typename Answer>
void QueueWorker::Deliver(Done done, Answer answer) {
  const absl::Time posted = absl::Now();
  answers_->Post([this, posted, done = std::move(done), answer = std::move(answer)]() mutable {
    done(std::move(answer));
    if (metrics_ != nullptr) {
      metrics_->RecordLaunchPhase(device_.name, "answer",
                                  absl::ToDoubleSeconds(absl::Now() - posted));
    }
  });
}

void QueueWorker::PublishLoad() {
  if (metrics_ == nullptr) return;
  const WorkerLoad load = Load();
  metrics_->SetQueueDepth(device_.name, static_cast<double>(load.queue_depth));
  metrics_->SetDeviceLoad(device_.name, load.queued_seconds,
                          static_cast<double>(load.reserved_bytes));
}

}  // namespace attnserve::engine
