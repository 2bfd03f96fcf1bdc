#include "server/engine/queue_worker.h"

#include <atomic>
#include <chrono>
#include <future>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

EngineOptions WithBatching(BatchingOptions batching) {
  EngineOptions options;
  options.batching = batching;
  return options;
}

// A worker whose Execute blocks until the test opens the gate, and records what each launch
// carried, so tests control exactly which jobs are queued together.
class GatedWorker : public QueueWorker {
 public:
  explicit GatedWorker(BatchingOptions batching, int lanes = 1)
      : GatedWorker(WithBatching(batching), lanes) {}
  // lanes = 0: the test starts them with Start().
  GatedWorker(const EngineOptions& options, int lanes)
      : QueueWorker(devices::DeviceDescription{}, options, nullptr) {
    if (lanes > 0) StartLanes(lanes);
  }
  void Start(int lanes) { StartLanes(lanes); }
  ~GatedWorker() override {
    Open();
    Stop();
  }

  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Number of sequences in each launch, in launch order.
  std::vector<size_t> launches() {
    std::lock_guard<std::mutex> lock(mu_);
    return launches_;
  }
  // The first q value of each launch's first part (its tag), in launch order.
  std::vector<float> launch_tags() {
    std::lock_guard<std::mutex> lock(mu_);
    return launch_tags_;
  }
  bool busy() { return busy_ > 0; }
  int busy_lanes() { return busy_; }
  std::vector<std::string> kernel_families() const override { return {"gated"}; }
  std::vector<CoverageRow> coverage() const override { return {}; }
  KernelCatalog catalog() const override { return KernelCatalog::Only("gated"); }

 private:
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& in, int /*lane*/) override {
    ++busy_;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
    launches_.push_back(in.cu_seqlens_q.size() - 1);
    float tag;
    std::memcpy(&tag, in.q.data, sizeof(tag));
    launch_tags_.push_back(tag);
    ForwardResult result;
    result.out = {in.q.dtype, in.q.shape, std::string(in.q.data, in.q.size_bytes)};
    result.lse = {DType::kFloat32, {in.q.shape[1], in.q.shape[0]},
                  std::string(4 * in.q.shape[1] * in.q.shape[0], '\0')};
    result.execution.kernel = "gated";
    --busy_;
    return result;
  }
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs&, int) override {
    return absl::UnimplementedError("not used");
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<int> busy_{0};
  std::vector<size_t> launches_;
  std::vector<float> launch_tags_;
};

// A one-sequence request whose q rows are all `tag`, so each answer shows whose rows it got.
struct TaggedRequest {
  TaggedRequest(float tag, int rows, int head_dim = 4)
      : q(rows * head_dim, tag), cu{0, rows} {}
  ForwardJob Job(std::promise<absl::StatusOr<ForwardResult>>* answer,
                 Priority priority = Priority::kNormal) const {
    ForwardJob job;
    job.control.priority = priority;
    const int64_t rows = cu[1], dim = static_cast<int64_t>(q.size()) / rows;
    const TensorView view{DType::kFloat32, {rows, 1, dim}, reinterpret_cast<const char*>(q.data()),
                          q.size() * sizeof(float)};
    job.inputs.q = job.inputs.k = job.inputs.v = view;
    job.inputs.cu_seqlens_q = job.inputs.cu_seqlens_k = cu;
    job.done = [answer](absl::StatusOr<ForwardResult> r) { answer->set_value(std::move(r)); };
    return job;
  }
  std::vector<float> q;
  std::vector<int32_t> cu;
};

void ExpectOwnRows(const absl::StatusOr<ForwardResult>& r, const TaggedRequest& req) {
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->out.data.size(), req.q.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(r->out.data.data(), req.q.data(), r->out.data.size()), 0);
  EXPECT_EQ(r->lse.shape, (std::vector<int64_t>{1, req.cu[1]}));
}

BatchingOptions BatchingOn() {
  BatchingOptions options;
  options.enabled = true;
  return options;
}

void WaitUntilBusy(GatedWorker& worker) {
  while (!worker.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Submit with no memory reservation and no estimate, as tests of batching alone need.
template <typename Worker>
void Submit(Worker& worker, ForwardJob job, JobCost cost = {}) {
  worker.Submit(std::move(job), cost);
}

TEST(QueueWorkerTest, QueuedCompatibleJobsShareOneLaunchAndGetTheirOwnRows) {
  GatedWorker worker(BatchingOn());
  std::vector<TaggedRequest> requests = {{1, 3}, {2, 5}, {3, 2}, {4, 7}, {5, 4, 8}};
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  Submit(worker, requests[0].Job(&answers[0]));
  WaitUntilBusy(worker);  // the first job is now held inside Execute
  for (size_t i = 1; i < requests.size(); ++i) Submit(worker, requests[i].Job(&answers[i]));
  worker.Open();
  std::vector<int> batched;
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<ForwardResult> r = answers[i].get_future().get();
    ExpectOwnRows(r, requests[i]);
    batched.push_back(r->execution.batched_requests);
  }
  // The head_dim-8 job cannot join the head_dim-4 batch; it runs after, alone.
  EXPECT_EQ(batched, (std::vector<int>{1, 3, 3, 3, 1}));
  EXPECT_EQ(worker.launches(), (std::vector<size_t>{1, 3, 1}));
}

TEST(QueueWorkerTest, TokenBudgetBoundsABatch) {
  BatchingOptions options = BatchingOn();
  options.max_batch_tokens = 10;
  GatedWorker worker(options);
  std::vector<TaggedRequest> requests = {{1, 1}, {2, 4}, {3, 4}, {4, 4}, {5, 4}};
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  Submit(worker, requests[0].Job(&answers[0]));
  WaitUntilBusy(worker);
  for (size_t i = 1; i < requests.size(); ++i) Submit(worker, requests[i].Job(&answers[i]));
  worker.Open();
  for (size_t i = 0; i < requests.size(); ++i) ExpectOwnRows(answers[i].get_future().get(), requests[i]);
  EXPECT_EQ(worker.launches(), (std::vector<size_t>{1, 2, 2}));
}

TEST(QueueWorkerTest, DisabledBatchingRunsJobsAlone) {
  BatchingOptions options;
  options.enabled = false;
  GatedWorker worker(options);
  std::vector<TaggedRequest> requests = {{1, 2}, {2, 2}, {3, 2}};
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  Submit(worker, requests[0].Job(&answers[0]));
  WaitUntilBusy(worker);
  for (size_t i = 1; i < requests.size(); ++i) Submit(worker, requests[i].Job(&answers[i]));
  worker.Open();
  for (auto& answer : answers) EXPECT_EQ(answer.get_future().get()->execution.batched_requests, 1);
  EXPECT_EQ(worker.launches(), (std::vector<size_t>{1, 1, 1}));
}

TEST(QueueWorkerTest, MaxQueueDelayWaitsForCompany) {
  BatchingOptions options = BatchingOn();
  options.max_queue_delay = absl::Milliseconds(300);
  GatedWorker worker(options);
  worker.Open();
  TaggedRequest a(1, 2), b(2, 3);
  std::promise<absl::StatusOr<ForwardResult>> answer_a, answer_b;
  Submit(worker, a.Job(&answer_a));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Submit(worker, b.Job(&answer_b));
  absl::StatusOr<ForwardResult> ra = answer_a.get_future().get();
  ExpectOwnRows(ra, a);
  ExpectOwnRows(answer_b.get_future().get(), b);
  EXPECT_EQ(ra->execution.batched_requests, 2);
  EXPECT_GE(ra->execution.queue_us, 250'000);  // a waited for company
}

TEST(QueueWorkerTest, ExpiredAndCancelledJobsAreDroppedBeforeLaunch) {
  GatedWorker worker(BatchingOn());
  TaggedRequest first(1, 2), expired(2, 2), cancelled(3, 2), alive(4, 2);
  std::promise<absl::StatusOr<ForwardResult>> a0, a1, a2, a3;
  Submit(worker, first.Job(&a0));
  WaitUntilBusy(worker);
  ForwardJob expiring = expired.Job(&a1);
  expiring.control.deadline = absl::Now() + absl::Milliseconds(20);
  Submit(worker, std::move(expiring));
  ForwardJob leaving = cancelled.Job(&a2);
  leaving.control.cancelled = [] { return true; };
  Submit(worker, std::move(leaving));
  Submit(worker, alive.Job(&a3));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  worker.Open();
  ExpectOwnRows(a0.get_future().get(), first);
  EXPECT_EQ(a1.get_future().get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a2.get_future().get().status().code(), absl::StatusCode::kCancelled);
  absl::StatusOr<ForwardResult> r3 = a3.get_future().get();
  ExpectOwnRows(r3, alive);
  EXPECT_EQ(r3->execution.batched_requests, 1);
  EXPECT_EQ(worker.launches(), (std::vector<size_t>{1, 1}));
}

TEST(QueueWorkerTest, LanesRunBatchesConcurrently) {
  BatchingOptions options;
  options.enabled = false;
  GatedWorker worker(options, /*lanes=*/2);
  TaggedRequest a(1, 2), b(2, 3), c(3, 4);
  std::promise<absl::StatusOr<ForwardResult>> ra, rb, rc;
  Submit(worker, a.Job(&ra));
  Submit(worker, b.Job(&rb));
  Submit(worker, c.Job(&rc));
  // Both lanes are inside Execute at once while the third job waits.
  while (worker.busy_lanes() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(worker.QueueDepth(), 1u);
  worker.Open();
  ExpectOwnRows(ra.get_future().get(), a);
  ExpectOwnRows(rb.get_future().get(), b);
  ExpectOwnRows(rc.get_future().get(), c);
}

TEST(QueueWorkerTest, ALaneLaunchesItsNextJobWhileTheLastAnswerIsStillBeingDelivered) {
  BatchingOptions options;
  options.enabled = false;
  GatedWorker worker(options, /*lanes=*/1);
  worker.Open();
  TaggedRequest a(1, 2), b(2, 3);
  // a's answer is held up on its answer thread (as a slow serialization would be).
  std::promise<void> release_a;
  std::shared_future<void> a_released = release_a.get_future().share();
  std::promise<absl::StatusOr<ForwardResult>> ra, rb;
  std::future<absl::StatusOr<ForwardResult>> answer_a = ra.get_future();
  ForwardJob job_a = a.Job(&ra);
  job_a.done = [&ra, a_released](absl::StatusOr<ForwardResult> r) {
    a_released.wait();
    ra.set_value(std::move(r));
  };
  Submit(worker, std::move(job_a));
  Submit(worker, b.Job(&rb));
  // The single lane runs b although a has not been answered yet. (Bounded, and a is released
  // before any verdict: were answers delivered on the lane, the lane would be stuck in a's.)
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (worker.launches().size() < 2 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const size_t launched = worker.launches().size();
  const bool a_pending =
      answer_a.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout;
  release_a.set_value();
  EXPECT_EQ(launched, 2u) << "b waited for a's answer to be delivered";
  EXPECT_TRUE(a_pending);
  ExpectOwnRows(answer_a.get(), a);
  ExpectOwnRows(rb.get_future().get(), b);
}

TEST(QueueWorkerTest, ABatchsAnswersAreDeliveredSideBySide) {
  EngineOptions options = WithBatching(BatchingOn());
  options.answer_threads_per_lane = 2;
  GatedWorker worker(options, /*lanes=*/0);
  TaggedRequest a(1, 2), b(2, 3);
  std::promise<absl::StatusOr<ForwardResult>> ra, rb;
  std::shared_future<absl::StatusOr<ForwardResult>> answer_b = rb.get_future().share();
  // a's delivery waits (bounded) for b's: with one answer thread per lane b would be queued
  // behind a, and a would give up.
  std::atomic<bool> b_answered_during_a{false};
  ForwardJob job_a = a.Job(&ra);
  job_a.done = [&ra, &b_answered_during_a, answer_b](absl::StatusOr<ForwardResult> r) {
    b_answered_during_a =
        answer_b.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    ra.set_value(std::move(r));
  };
  Submit(worker, std::move(job_a));
  Submit(worker, b.Job(&rb));
  worker.Start(1);  // one lane takes both queued jobs as one batch
  worker.Open();
  ExpectOwnRows(ra.get_future().get(), a);
  ExpectOwnRows(answer_b.get(), b);
  EXPECT_EQ(worker.launches(), (std::vector<size_t>{2}));  // one launch of both sequences
  EXPECT_TRUE(b_answered_during_a);
}

TEST(QueueWorkerTest, StopAnswersEveryQueuedJob) {
  std::vector<TaggedRequest> requests;
  for (int i = 0; i < 50; ++i) requests.emplace_back(i, 1 + i % 4, 4 + 4 * (i % 3));
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  {
    GatedWorker worker(BatchingOn());
    for (size_t i = 0; i < requests.size(); ++i) Submit(worker, requests[i].Job(&answers[i]));
  }  // the destructor opens the gate and stops: every job must be answered
  for (size_t i = 0; i < requests.size(); ++i) ExpectOwnRows(answers[i].get_future().get(), requests[i]);
}


EngineOptions MemoryBudgetOf(int64_t bytes) {
  EngineOptions options;
  options.device_memory_bytes = bytes;
  return options;
}

TEST(QueueWorkerTest, AJobThatDoesNotFitBesideTheRunningOnesWaitsForTheirMemory) {
  GatedWorker worker(MemoryBudgetOf(100), /*lanes=*/2);
  EXPECT_EQ(worker.memory_budget(), 100);
  TaggedRequest a(1, 2), b(2, 2), c(3, 2);
  std::promise<absl::StatusOr<ForwardResult>> ra, rb, rc;
  Submit(worker, a.Job(&ra), {60, 1.0});
  WaitUntilBusy(worker);
  Submit(worker, b.Job(&rb), {60, 1.0});  // fits the budget, not beside a
  Submit(worker, c.Job(&rc), {10, 1.0});  // would fit, but waits behind b: no overtaking
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(worker.busy_lanes(), 1);  // the second lane is free, and still b waits
  WorkerLoad load = worker.Load();
  EXPECT_EQ(load.queue_depth, 2u);
  EXPECT_EQ(load.reserved_bytes, 60);
  EXPECT_DOUBLE_EQ(load.queued_seconds, 3.0);
  worker.Open();
  ExpectOwnRows(ra.get_future().get(), a);
  absl::StatusOr<ForwardResult> answer_b = rb.get_future().get();
  ExpectOwnRows(answer_b, b);
  EXPECT_GE(answer_b->execution.queue_us, 90'000);
  ExpectOwnRows(rc.get_future().get(), c);
  worker.Stop();
  load = worker.Load();
  EXPECT_EQ(load.reserved_bytes, 0);
  EXPECT_EQ(load.queued_seconds, 0);
  // b and c may run side by side once a is done, so only a's place is fixed.
  std::vector<float> tags = worker.launch_tags();
  ASSERT_EQ(tags.size(), 3u);
  EXPECT_EQ(tags[0], 1);
}

TEST(QueueWorkerTest, AJobWaitingForMemoryIsAnsweredAtItsDeadline) {
  GatedWorker worker(MemoryBudgetOf(100), /*lanes=*/2);
  TaggedRequest a(1, 2), b(2, 2);
  std::promise<absl::StatusOr<ForwardResult>> ra, rb;
  Submit(worker, a.Job(&ra), {60, 0});
  WaitUntilBusy(worker);
  ForwardJob waiting = b.Job(&rb);
  waiting.control.deadline = absl::Now() + absl::Milliseconds(100);
  Submit(worker, std::move(waiting), {60, 0});
  // Answered while `a` still holds the memory, not when it finishes.
  std::future<absl::StatusOr<ForwardResult>> answer_b = rb.get_future();
  ASSERT_EQ(answer_b.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(answer_b.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(worker.QueueDepth(), 0u);
  worker.Open();
  ExpectOwnRows(ra.get_future().get(), a);
}

TEST(QueueWorkerTest, HigherPriorityLaunchesFirstThenArrivalOrder) {
  EngineOptions options;
  options.priority_aging = absl::Seconds(60);  // no aging within the test
  GatedWorker worker(options, /*lanes=*/1);
  TaggedRequest blocker(0, 2), low1(1, 2), normal(2, 2), high1(3, 2), low2(4, 2), high2(5, 2);
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(6);
  Submit(worker, blocker.Job(&answers[0]));
  WaitUntilBusy(worker);
  Submit(worker, low1.Job(&answers[1], Priority::kLow));
  Submit(worker, normal.Job(&answers[2], Priority::kNormal));
  Submit(worker, high1.Job(&answers[3], Priority::kHigh));
  Submit(worker, low2.Job(&answers[4], Priority::kLow));
  Submit(worker, high2.Job(&answers[5], Priority::kHigh));
  worker.Open();
  for (auto& answer : answers) ASSERT_TRUE(answer.get_future().get().ok());
  EXPECT_EQ(worker.launch_tags(), (std::vector<float>{0, 3, 5, 2, 1, 4}));
}

TEST(QueueWorkerTest, WaitingAgesALowPriorityJobPastNewHighPriorityOnes) {
  EngineOptions options;
  options.priority_aging = absl::Milliseconds(30);
  GatedWorker worker(options, /*lanes=*/1);
  TaggedRequest blocker(0, 2), low(1, 2), high(2, 2);
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(3);
  Submit(worker, blocker.Job(&answers[0]));
  WaitUntilBusy(worker);
  Submit(worker, low.Job(&answers[1], Priority::kLow));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // > 2 aging intervals
  Submit(worker, high.Job(&answers[2], Priority::kHigh));
  worker.Open();
  for (auto& answer : answers) ASSERT_TRUE(answer.get_future().get().ok());
  // Both compete as high now, and the low one arrived first.
  EXPECT_EQ(worker.launch_tags(), (std::vector<float>{0, 1, 2}));
}

TEST(QueueWorkerTest, ABacklogIsSpreadOverTheIdleLanes) {
  GatedWorker worker(WithBatching(BatchingOn()), /*lanes=*/0);
  std::vector<TaggedRequest> requests;
  for (int i = 0; i < 8; ++i) requests.emplace_back(i, 2);
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) Submit(worker, requests[i].Job(&answers[i]));
  worker.Start(2);
  while (worker.busy_lanes() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  worker.Open();
  for (size_t i = 0; i < requests.size(); ++i) {
    ExpectOwnRows(answers[i].get_future().get(), requests[i]);
  }
  EXPECT_EQ(worker.launches(), (std::vector<size_t>{4, 4}));
}

}  // namespace
}  // namespace attnserve::engine
