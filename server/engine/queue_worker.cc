#include "server/engine/queue_worker.h"

#include "absl/strings/str_cat.h"
#include "server/engine/batching.h"
#include "server/engine/request_cost.h"

namespace attnserve::engine {
namespace {

template <typename Job>
const auto& InputsOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::get<Job>(job).inputs;
}

bool SameKindAndCompatible(const std::variant<ForwardJob, BackwardJob>& a,
                           const std::variant<ForwardJob, BackwardJob>& b) {
  if (a.index() != b.index()) return false;
  if (a.index() == 0) return Compatible(InputsOf<ForwardJob>(a), InputsOf<ForwardJob>(b));
  return Compatible(InputsOf<BackwardJob>(a), InputsOf<BackwardJob>(b));
}

int64_t QueryTokensOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::visit([](const auto& j) { return QueryTokens(j.inputs); }, job);
}
int64_t KeyTokensOf(const std::variant<ForwardJob, BackwardJob>& job) {
  return std::visit([](const auto& j) { return KeyTokens(j.inputs); }, job);
}

// The merge and split of each job kind.
template <typename Job>
struct BatchOps;
template <>
struct BatchOps<ForwardJob> {
  using Inputs = ForwardInputs;
  using Result = ForwardResult;
  static MergedForward Merge(const std::vector<const Inputs*>& parts) { return MergeForward(parts); }
  static std::vector<Result> Split(const Result& merged, const BatchLayout& layout) {
    return SplitForward(merged, layout);
  }
};
template <>
struct BatchOps<BackwardJob> {
  using Inputs = BackwardInputs;
  using Result = BackwardResult;
  static MergedBackward Merge(const std::vector<const Inputs*>& parts) {
    return MergeBackward(parts);
  }
  static std::vector<Result> Split(const Result& merged, const BatchLayout& layout) {
    return SplitBackward(merged, layout);
  }
};

}  // namespace

QueueWorker::QueueWorker(devices::DeviceDescription device, BatchingOptions batching,
                         metrics::ServerMetrics* metrics)
    : device_(std::move(device)), batching_(batching), metrics_(metrics) {}

QueueWorker::~QueueWorker() { Stop(); }

void QueueWorker::StartLanes(int lanes) {
  for (int lane = 0; lane < lanes; ++lane) {
    lanes_.emplace_back([this, lane] {
      OnLaneStart(lane);
      Loop(lane);
    });
  }
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
  cv_.notify_all();
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
  for (std::thread& lane : lanes_) {
    if (lane.joinable()) lane.join();
  }
}

void QueueWorker::Loop(int lane) {
  for (;;) {
    std::vector<Queued> batch = NextBatch();
    if (batch.empty()) return;  // stopped with nothing left: accepted jobs are all answered
    DropDeadJobs(batch);
    if (batch.empty()) continue;
    if (std::holds_alternative<ForwardJob>(batch[0].job)) {
      RunBatch<ForwardJob>(batch, "Forward", lane);
    } else {
      RunBatch<BackwardJob>(batch, "Backward", lane);
    }
  }
}

std::vector<QueueWorker::Queued> QueueWorker::NextBatch() {
  std::vector<Queued> batch;
  size_t depth;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return batch;
    // The oldest job always goes next, so incompatible jobs are never starved by batching.
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
    if (batching_.enabled) {
      int64_t q_tokens = QueryTokensOf(batch[0].job), k_tokens = KeyTokensOf(batch[0].job);
      const absl::Time wait_until = batch[0].enqueued + batching_.max_queue_delay;
      for (;;) {
        TakeCompatible(batch, q_tokens, k_tokens);
        if (stopping_ || absl::Now() >= wait_until) break;
        cv_.wait_until(lock, absl::ToChronoTime(wait_until));
      }
    }
    depth = queue_.size();
  }
  PublishQueueDepth(depth);
  return batch;
}

void QueueWorker::TakeCompatible(std::vector<Queued>& batch, int64_t& q_tokens,
                                 int64_t& k_tokens) {
  for (auto it = queue_.begin(); it != queue_.end();) {
    const int64_t q = QueryTokensOf(it->job), k = KeyTokensOf(it->job);
    if (SameKindAndCompatible(batch[0].job, it->job) &&
        q_tokens + q <= batching_.max_batch_tokens && k_tokens + k <= batching_.max_batch_tokens) {
      q_tokens += q;
      k_tokens += k;
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

void QueueWorker::DropDeadJobs(std::vector<Queued>& batch) {
  const absl::Time now = absl::Now();
  std::vector<Queued> alive;
  for (Queued& queued : batch) {
    std::visit(
        [&](auto& job) {
          absl::Status dropped;
          // Deadline first: a transport may also report an expired call as cancelled.
          if (now >= job.control.deadline) {
            dropped = absl::DeadlineExceededError(absl::StrCat(
                "deadline passed after ", absl::FormatDuration(now - queued.enqueued),
                " in the queue of ", device_.name, "; the request did not run"));
          } else if (job.control.cancelled && job.control.cancelled()) {
            dropped = absl::CancelledError("the caller cancelled the request before it ran");
          }
          if (dropped.ok()) {
            alive.push_back(std::move(queued));
          } else {
            job.done(dropped);
          }
        },
        queued.job);
  }
  batch = std::move(alive);
}

// Runs the batch as one request (merging when there are several), then answers each job with
// its own share of the result, stamped with how long it waited.
template <typename Job>
void QueueWorker::RunBatch(std::vector<Queued>& batch, const char* rpc, int lane) {
  using Ops = BatchOps<Job>;
  std::vector<const typename Ops::Inputs*> parts;
  for (const Queued& queued : batch) parts.push_back(&std::get<Job>(queued.job).inputs);

  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<typename Ops::Result>> answers;
  if (parts.size() == 1) {
    answers.push_back(Execute(*parts[0], lane));
  } else {
    auto merged = Ops::Merge(parts);
    absl::StatusOr<typename Ops::Result> result = Execute(merged.inputs, lane);
    if (result.ok()) {
      for (auto& share : Ops::Split(*result, merged.layout)) answers.push_back(std::move(share));
    } else {
      answers.assign(parts.size(), result.status());
    }
  }
  if (metrics_ != nullptr) metrics_->RecordBatch(static_cast<int>(batch.size()));

  for (size_t i = 0; i < batch.size(); ++i) {
    Job& job = std::get<Job>(batch[i].job);
    absl::StatusOr<typename Ops::Result>& answer = answers[i];
    if (answer.ok()) {
      ExecutionReport& report = answer->execution;
      report.queue_us = absl::ToInt64Microseconds(start - batch[i].enqueued);
      report.batched_requests = static_cast<int32_t>(batch.size());
      if (metrics_ != nullptr) {
        metrics_->RecordExecution(rpc, report.kernel, report.device,
                                  absl::ToDoubleSeconds(start - batch[i].enqueued),
                                  report.compute_us * 1e-6,
                                  static_cast<double>(QueryTokens(job.inputs)),
                                  AttentionFlops(job.inputs));
      }
    }
    job.done(std::move(answer));
  }
}

void QueueWorker::PublishQueueDepth(size_t depth) {
  if (metrics_ != nullptr) metrics_->SetQueueDepth(device_.name, static_cast<double>(depth));
}

}  // namespace attnserve::engine
