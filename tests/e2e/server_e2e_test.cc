// End-to-end: the real attnserve binary, driven by the C++ client over loopback.
#include <atomic>
#include <thread>

#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "shared_server_test.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;
using tools::ProblemSpec;

void ExpectClose(const v1::Tensor& got, const std::vector<float>& want, double tol,
                 const char* what) {
  absl::StatusOr<std::vector<float>> values = TensorToFloats(got);
  ASSERT_TRUE(values.ok()) << what << ": " << values.status();
  const tools::ErrorStats stats = tools::Compare(*values, want);
  EXPECT_FALSE(stats.mismatched_nonfinite) << what;
  EXPECT_LE(stats.relative, tol) << what;
}

// Forward through the server, checked against the local reference.
void CheckForward(Client& client, const ProblemSpec& spec) {
  const tools::Problem problem = tools::MakeRandomProblem(spec);
  absl::StatusOr<v1::ForwardResponse> response = client.Forward(problem.MakeForwardRequest());
  ASSERT_TRUE(response.ok()) << response.status();
  const tools::ForwardAnswer want = tools::ReferenceForward(problem);
  ExpectClose(response->out(), want.out, tools::Tolerance(spec.dtype), "out");
  ExpectClose(response->lse(), want.lse, 1e-5, "lse");
  EXPECT_EQ(response->out().dtype(), spec.dtype);
  EXPECT_EQ(response->execution().device(), "cpu");
  EXPECT_EQ(response->execution().kernel(), "reference");
  EXPECT_GE(response->execution().batched_requests(), 1);
}

class ServerE2ETest : public SharedServerTest {};

TEST_F(ServerE2ETest, ForwardMatchesTheReferenceForEveryOption) {
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    ProblemSpec spec;
    spec.dtype = dtype;
    spec.max_seqlen_q = 40;
    spec.max_seqlen_k = 56;
    spec.head_dim = 32;
    SCOPED_TRACE(v1::DType_Name(dtype));
    CheckForward(*client_, spec);
    spec.causal = true;
    CheckForward(*client_, spec);
    spec.causal = false;
    spec.window_left = 5;
    spec.window_right = 2;
    CheckForward(*client_, spec);
    spec.window_left.reset();
    spec.window_right.reset();
    spec.softcap = 5.0f;
    spec.softmax_scale = 0.3f;
    spec.num_heads = 8;
    spec.num_heads_k = 2;
    CheckForward(*client_, spec);
  }
}

TEST_F(ServerE2ETest, BackwardMatchesTheReference) {
  ProblemSpec spec;
  spec.dtype = v1::DTYPE_FLOAT32;
  spec.max_seqlen_q = 33;
  spec.max_seqlen_k = 47;
  spec.num_heads = 4;
  spec.num_heads_k = 1;
  spec.causal = true;
  spec.softcap = 8.0f;
  const tools::Problem problem = tools::MakeRandomProblem(spec);
  const tools::ForwardAnswer forward = tools::ReferenceForward(problem);
  absl::StatusOr<v1::BackwardResponse> response =
      client_->Backward(problem.MakeBackwardRequest(forward.out, forward.lse));
  ASSERT_TRUE(response.ok()) << response.status();
  const tools::BackwardAnswer want = tools::ReferenceBackward(problem, forward.out, forward.lse);
  ExpectClose(response->dq(), want.dq, 1e-5, "dq");
  ExpectClose(response->dk(), want.dk, 1e-5, "dk");
  ExpectClose(response->dv(), want.dv, 1e-5, "dv");
  EXPECT_EQ(response->execution().kernel(), "reference");
}

TEST_F(ServerE2ETest, MalformedRequestsAreRejectedAndTheServerKeepsServing) {
  const tools::Problem problem = tools::MakeRandomProblem({});
  v1::ForwardRequest bad = problem.MakeForwardRequest();
  bad.mutable_k()->set_dtype(v1::DTYPE_FLOAT16);
  absl::Status s = client_->Forward(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k.dtype"));

  bad = problem.MakeForwardRequest();
  bad.mutable_q()->mutable_data()->pop_back();
  s = client_->Forward(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("q.data"));

  bad = problem.MakeForwardRequest();
  bad.set_cu_seqlens_q(1, -4);
  s = client_->Forward(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cu_seqlens_q"));

  v1::BackwardRequest bad_backward;
  s = client_->Backward(bad_backward).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  CheckForward(*client_, {});
}

TEST_F(ServerE2ETest, ConcurrentClientsAllGetTheirOwnCorrectAnswers) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([t] {
      std::unique_ptr<Client> client = server_->NewClient();
      for (int i = 0; i < 4; ++i) {
        ProblemSpec spec;
        spec.seed = 100 * t + i;
        spec.batch = 1 + (t + i) % 3;
        spec.max_seqlen_q = 16 + 8 * i;
        spec.max_seqlen_k = 24 + 4 * t;
        spec.causal = (t + i) % 2 == 0;
        CheckForward(*client, spec);
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

TEST_F(ServerE2ETest, ServerInfoDescribesTheServer) {
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).name(), "cpu");
  EXPECT_GT(info->devices(0).memory_total_bytes(), 0);
  EXPECT_THAT(info->kernel_families(), ::testing::Contains("reference"));
  EXPECT_EQ(info->limits().max_head_dim(), 256);
  EXPECT_GE(info->limits().max_message_bytes(), int64_t{1} << 30);
}

TEST(ServerLimitsE2ETest, LimitsAreResourceExhaustedAndReported) {
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({"--max_total_tokens=64", "--max_head_dim=32"});
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->NewClient();
  ProblemSpec spec;
  spec.max_seqlen_q = 100;
  spec.head_dim = 16;
  absl::Status s = client->Forward(tools::MakeRandomProblem(spec).MakeForwardRequest()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_total_tokens"));
  spec.max_seqlen_q = 16;
  spec.max_seqlen_k = 16;
  spec.head_dim = 64;
  s = client->Forward(tools::MakeRandomProblem(spec).MakeForwardRequest()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_head_dim"));
  EXPECT_EQ(client->GetServerInfo()->limits().max_total_tokens(), 64);
  EXPECT_EQ(server->Terminate(), 0);
}

TEST(ServerFlagsE2ETest, BadFlagsFailAtStartupNamingTheFlag) {
  std::string output;
  EXPECT_EQ(ServerProcess::RunToExit({"--max_head_dim=0"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--max_head_dim=0 is out of range"));
  EXPECT_EQ(ServerProcess::RunToExit({"--answer_threads_per_lane=0"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--answer_threads_per_lane=0 is out of range"));
  EXPECT_EQ(ServerProcess::RunToExit({"--stage_threads_per_lane=17"}, &output), 2);
  EXPECT_THAT(output, HasSubstr("--stage_threads_per_lane=17 is out of range"));
  EXPECT_EQ(ServerProcess::RunToExit({"--devices=7", "--grpc_port=0", "--http_port=0"}, &output),
            1);
  EXPECT_THAT(output, HasSubstr("--devices=7"));
}

// A second server on a running one's gRPC or HTTP port fails to start, naming the address,
// instead of sharing the port (gRPC's default SO_REUSEPORT would split new connections between
// the two); the running server keeps answering.
TEST(ServerFlagsE2ETest, APortInUseFailsTheSecondServerNamingIt) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  const std::string grpc_port = std::to_string(server->grpc_port());
  const std::string http_port = std::to_string(server->http_port());
  std::string output;
  EXPECT_EQ(ServerProcess::RunToExit({"--host=127.0.0.1", "--devices=cpu", "--data_port=0",
                                      "--grpc_port=" + grpc_port, "--http_port=0"},
                                     &output),
            1);
  EXPECT_THAT(output, HasSubstr("gRPC server could not listen on 127.0.0.1:" + grpc_port));
  EXPECT_EQ(ServerProcess::RunToExit({"--host=127.0.0.1", "--devices=cpu", "--data_port=0",
                                      "--grpc_port=0", "--http_port=" + http_port},
                                     &output),
            1);
  EXPECT_THAT(output, HasSubstr("HTTP server could not listen on 127.0.0.1:" + http_port));
  EXPECT_TRUE(server->NewClient()->GetServerInfo().ok());
}

TEST(ServerShutdownE2ETest, SigtermUnderLoadFinishesAcceptedWork) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--cpu_threads=1"});
  ASSERT_NE(server, nullptr);
  std::atomic<int> completed{0}, refused{0}, wrong{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<Client> client = server->NewClient();
      for (int i = 0; !stop && i < 200; ++i) {
        ProblemSpec spec;
        spec.seed = 1000 * t + i;
        spec.max_seqlen_q = 96;
        spec.max_seqlen_k = 96;
        const tools::Problem problem = tools::MakeRandomProblem(spec);
        absl::StatusOr<v1::ForwardResponse> r = client->Forward(problem.MakeForwardRequest());
        if (r.ok()) {
          const tools::ForwardAnswer want = tools::ReferenceForward(problem);
          const tools::ErrorStats e = tools::Compare(*TensorToFloats(r->out()), want.out);
          (e.relative <= tools::Tolerance(spec.dtype) ? completed : wrong)++;
        } else if (r.status().code() == absl::StatusCode::kUnavailable ||
                   r.status().code() == absl::StatusCode::kCancelled) {
          // Refused: UNAVAILABLE once the server stops accepting; CANCELLED for a call that
          // reached the server's transport but no handler before shutdown began (gRPC resets
          // such streams). Neither ran, so a client may retry it elsewhere.
          refused++;
          return;
        } else {
          ADD_FAILURE() << "unexpected status during shutdown: " << r.status();
          wrong++;
        }
      }
    });
  }
  while (completed < 6) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server->SendSigterm();
  const int exit_code = server->WaitForExit(60);
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(exit_code, 0) << server->Log();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(completed.load(), 6);
  EXPECT_THAT(server->Log(), HasSubstr("draining"));
}

}  // namespace
}  // namespace attnserve::testing
