// End-to-end: attnserve::Client's asynchronous calls against the real server, over the data
// channel (the default) and over gRPC.
#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

// Counts callbacks down; Wait() returns once all have run (or fails after a minute).
class Countdown {
 public:
  explicit Countdown(int count) : remaining_(count) {}
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--remaining_ == 0) cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [this] { return remaining_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int remaining_;
};

double RelativeError(const v1::Tensor& got, const std::vector<float>& want) {
  absl::StatusOr<std::vector<float>> values = TensorToFloats(got);
  if (!values.ok()) return 1e30;
  const tools::ErrorStats stats = tools::Compare(*values, want);
  return stats.mismatched_nonfinite ? 1e30 : stats.relative;
}

tools::ProblemSpec SmallSpec(uint64_t seed) {
  tools::ProblemSpec spec;
  spec.seed = seed;
  spec.batch = 1 + seed % 3;
  spec.max_seqlen_q = 16 + 4 * (seed % 5);
  spec.max_seqlen_k = 20 + 3 * (seed % 4);
  spec.num_heads = 4;
  spec.num_heads_k = seed % 2 == 0 ? 4 : 2;
  spec.head_dim = 32;
  spec.dtype = v1::DTYPE_FLOAT32;
  spec.causal = seed % 2 == 1;
  return spec;
}

// Each test runs once per transport; the client must really be on it.
class AsyncClientE2ETest : public ::testing::TestWithParam<Transport> {
 protected:
  std::unique_ptr<Client> NewClient(const ServerProcess& server) {
    std::unique_ptr<Client> client = server.NewClient(GetParam());
    EXPECT_EQ(client->ActiveTransport().value_or("?"),
              GetParam() == Transport::kGrpc ? "grpc" : "data channel (4 connection(s))");
    return client;
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, AsyncClientE2ETest,
                         ::testing::Values(Transport::kDataChannel, Transport::kGrpc),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return info.param == Transport::kGrpc ? "Grpc" : "DataChannel";
                         });

TEST_P(AsyncClientE2ETest, ManyConcurrentCallsAllCompleteWithTheirOwnAnswers) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = NewClient(*server);
  constexpr int kForward = 48, kBackward = 16;
  std::vector<tools::Problem> problems;
  for (int i = 0; i < kForward + kBackward; ++i) {
    problems.push_back(tools::MakeRandomProblem(SmallSpec(i)));
  }
  std::vector<tools::ForwardAnswer> forwards;
  for (const tools::Problem& p : problems) forwards.push_back(tools::ReferenceForward(p));

  std::vector<std::optional<absl::StatusOr<v1::ForwardResponse>>> forward_results(kForward);
  std::vector<std::optional<absl::StatusOr<v1::BackwardResponse>>> backward_results(kBackward);
  Countdown countdown(kForward + kBackward);
  // All calls are started before any is waited for, so they overlap in flight.
  for (int i = 0; i < kForward; ++i) {
    client->ForwardAsync(problems[i].MakeForwardRequest(),
                         [&, i](absl::StatusOr<v1::ForwardResponse> r) {
                           forward_results[i] = std::move(r);
                           countdown.Done();
                         });
  }
  for (int i = 0; i < kBackward; ++i) {
    const tools::Problem& p = problems[kForward + i];
    auto request = std::make_shared<const v1::BackwardRequest>(
        p.MakeBackwardRequest(forwards[kForward + i].out, forwards[kForward + i].lse));
    client->BackwardAsync(request, [&, i](absl::StatusOr<v1::BackwardResponse> r) {
      backward_results[i] = std::move(r);
      countdown.Done();
    });
  }
  ASSERT_TRUE(countdown.Wait()) << "not every callback ran";

  for (int i = 0; i < kForward; ++i) {
    ASSERT_TRUE(forward_results[i].has_value());
    const absl::StatusOr<v1::ForwardResponse>& r = *forward_results[i];
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_LE(RelativeError(r->out(), forwards[i].out), 1e-5) << i;
    EXPECT_LE(RelativeError(r->lse(), forwards[i].lse), 1e-5) << i;
  }
  for (int i = 0; i < kBackward; ++i) {
    const tools::Problem& p = problems[kForward + i];
    const tools::BackwardAnswer want =
        tools::ReferenceBackward(p, forwards[kForward + i].out, forwards[kForward + i].lse);
    const absl::StatusOr<v1::BackwardResponse>& r = *backward_results[i];
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_LE(RelativeError(r->dq(), want.dq), 1e-5) << i;
    EXPECT_LE(RelativeError(r->dk(), want.dk), 1e-5) << i;
    EXPECT_LE(RelativeError(r->dv(), want.dv), 1e-5) << i;
  }
}

TEST_P(AsyncClientE2ETest, ErrorsAndDeadlinesArriveThroughTheCallback) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--cpu_threads=1"});
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = NewClient(*server);
  v1::ForwardRequest bad = tools::MakeRandomProblem({}).MakeForwardRequest();
  bad.mutable_k()->set_dtype(v1::DTYPE_FLOAT16);
  absl::Status bad_status;
  Countdown bad_done(1);
  client->ForwardAsync(bad, [&](absl::StatusOr<v1::ForwardResponse> r) {
    bad_status = r.status();
    bad_done.Done();
  });
  ASSERT_TRUE(bad_done.Wait());
  EXPECT_EQ(bad_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_status.message()), ::testing::HasSubstr("k.dtype"));

  // A 100 ms deadline covers choosing the transport (one GetServerInfo, and the data channel's
  // HELLOs), but not moving and computing this request on one CPU thread.
  ClientOptions options;
  options.transport = GetParam();
  options.timeout = std::chrono::milliseconds(100);
  std::unique_ptr<Client> hurried = *Client::Create(server->target(), options);
  ASSERT_TRUE(hurried->ActiveTransport().ok());
  tools::ProblemSpec spec;
  spec.batch = 4;
  spec.max_seqlen_q = spec.max_seqlen_k = 2048;
  spec.num_heads = spec.num_heads_k = 16;
  absl::Status late_status;
  Countdown late_done(1);
  hurried->ForwardAsync(tools::MakeRandomProblem(spec).MakeForwardRequest(),
                        [&](absl::StatusOr<v1::ForwardResponse> r) {
                          late_status = r.status();
                          late_done.Done();
                        });
  ASSERT_TRUE(late_done.Wait());
  EXPECT_EQ(late_status.code(), absl::StatusCode::kDeadlineExceeded) << late_status;
}

TEST_P(AsyncClientE2ETest, CallsOutliveTheirRequestAndTheClientWaitsForThem) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  constexpr int kCalls = 12;
  std::vector<tools::Problem> problems;
  std::vector<tools::ForwardAnswer> want;
  for (int i = 0; i < kCalls; ++i) {
    problems.push_back(tools::MakeRandomProblem(SmallSpec(100 + i)));
    want.push_back(tools::ReferenceForward(problems.back()));
  }
  std::vector<double> errors(kCalls, 1e30);  // until each callback runs
  Countdown countdown(kCalls);
  {
    std::unique_ptr<Client> client = NewClient(*server);
    for (int i = 0; i < kCalls; ++i) {
      // The request is a temporary, gone before any answer.
      client->ForwardAsync(problems[i].MakeForwardRequest(),
                           [&, i](absl::StatusOr<v1::ForwardResponse> r) {
                             errors[i] = r.ok() ? RelativeError(r->out(), want[i].out) : 1e30;
                             countdown.Done();
                           });
    }
  }
  // Destroying the client waited for every callback, so all have run by now.
  for (int i = 0; i < kCalls; ++i) EXPECT_LE(errors[i], 1e-5) << i;
  EXPECT_TRUE(countdown.Wait());
}

}  // namespace
}  // namespace attnserve::testing
