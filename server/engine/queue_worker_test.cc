#include "server/engine/queue_worker.h"

#include <atomic>
#include <future>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

// A worker whose Execute blocks until the test opens the gate, and records what each launch
// carried, so tests control exactly which jobs are queued together.
class GatedWorker : public QueueWorker {
 public:
  explicit GatedWorker(BatchingOptions batching, int lanes = 1)
      : QueueWorker(devices::DeviceDescription{}, batching, nullptr) {
    StartLanes(lanes);
  }
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
  bool busy() { return busy_ > 0; }
  int busy_lanes() { return busy_; }
  std::vector<std::string> kernel_families() const override { return {"gated"}; }

 private:
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& in, int /*lane*/) override {
    ++busy_;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
    launches_.push_back(in.cu_seqlens_q.size() - 1);
    ForwardResult result;
    result.out = {in.q.dtype, in.q.shape, std::string(in.q.data, in.q.size_bytes)};
    result.lse = {DType::kFloat32, {in.q.shape[1], in.q.shape[0]},
                  std::string(4 * in.q.shape[1] * in.q.shape[0], '\0')};
    result.execution.kernel = "gated";
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
};

// A one-sequence request whose q rows are all `tag`, so each answer shows whose rows it got.
struct TaggedRequest {
  TaggedRequest(float tag, int rows, int head_dim = 4)
      : q(rows * head_dim, tag), cu{0, rows} {}
  ForwardJob Job(std::promise<absl::StatusOr<ForwardResult>>* answer) const {
    ForwardJob job;
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

TEST(QueueWorkerTest, QueuedCompatibleJobsShareOneLaunchAndGetTheirOwnRows) {
  GatedWorker worker(BatchingOn());
  std::vector<TaggedRequest> requests = {{1, 3}, {2, 5}, {3, 2}, {4, 7}, {5, 4, 8}};
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  worker.Submit(requests[0].Job(&answers[0]));
  WaitUntilBusy(worker);  // the first job is now held inside Execute
  for (size_t i = 1; i < requests.size(); ++i) worker.Submit(requests[i].Job(&answers[i]));
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
  worker.Submit(requests[0].Job(&answers[0]));
  WaitUntilBusy(worker);
  for (size_t i = 1; i < requests.size(); ++i) worker.Submit(requests[i].Job(&answers[i]));
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
  worker.Submit(requests[0].Job(&answers[0]));
  WaitUntilBusy(worker);
  for (size_t i = 1; i < requests.size(); ++i) worker.Submit(requests[i].Job(&answers[i]));
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
  worker.Submit(a.Job(&answer_a));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  worker.Submit(b.Job(&answer_b));
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
  worker.Submit(first.Job(&a0));
  WaitUntilBusy(worker);
  ForwardJob expiring = expired.Job(&a1);
  expiring.control.deadline = absl::Now() + absl::Milliseconds(20);
  worker.Submit(std::move(expiring));
  ForwardJob leaving = cancelled.Job(&a2);
  leaving.control.cancelled = [] { return true; };
  worker.Submit(std::move(leaving));
  worker.Submit(alive.Job(&a3));
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
  worker.Submit(a.Job(&ra));
  worker.Submit(b.Job(&rb));
  worker.Submit(c.Job(&rc));
  // Both lanes are inside Execute at once while the third job waits.
  while (worker.busy_lanes() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(worker.QueueDepth(), 1u);
  worker.Open();
  ExpectOwnRows(ra.get_future().get(), a);
  ExpectOwnRows(rb.get_future().get(), b);
  ExpectOwnRows(rc.get_future().get(), c);
}

TEST(QueueWorkerTest, StopAnswersEveryQueuedJob) {
  std::vector<TaggedRequest> requests;
  for (int i = 0; i < 50; ++i) requests.emplace_back(i, 1 + i % 4, 4 + 4 * (i % 3));
  std::vector<std::promise<absl::StatusOr<ForwardResult>>> answers(requests.size());
  {
    GatedWorker worker(BatchingOn());
    for (size_t i = 0; i < requests.size(); ++i) worker.Submit(requests[i].Job(&answers[i]));
  }  // the destructor opens the gate and stops: every job must be answered
  for (size_t i = 0; i < requests.size(); ++i) ExpectOwnRows(answers[i].get_future().get(), requests[i]);
}

}  // namespace
}  // namespace attnserve::engine
