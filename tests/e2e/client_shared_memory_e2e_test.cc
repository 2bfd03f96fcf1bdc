// End-to-end: attnserve::Client through system shared memory (ClientOptions::shared_memory)
// against the real server with --allow_shared_memory: answers and errors bitwise those of the
// native path, the region registered once, grown, one per concurrent call, registered again
// after a server restart, unregistered and unlinked with the Client; the data channel for
// servers without the flag (kAuto) or FAILED_PRECONDITION (kOn). The data channel's byte
// counter and the server's region status tell which path the tensors took.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <string>

#include "attnserve/tensor_codec.h"
#include "client/cpp/src/this_host.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server_metrics.h"
#include "server_process.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kAllow = {"--allow_shared_memory"};

tools::Problem MakeProblem(v1::DType dtype, uint64_t seed, int max_seqlen = 40,
                           bool window = false) {
  tools::ProblemSpec spec;
  spec.dtype = dtype;
  spec.batch = 2;
  spec.max_seqlen_q = max_seqlen;
  spec.max_seqlen_k = max_seqlen + 8;
  spec.num_heads = 4;
  spec.num_heads_k = 2;
  spec.head_dim = 32;
  spec.causal = !window;
  if (window) {
    spec.window_left = 5;
    spec.window_right = 2;
    spec.softcap = 4.0f;
    spec.softmax_scale = 0.3f;
  }
  spec.seed = seed;
  return tools::MakeRandomProblem(spec);
}

std::unique_ptr<Client> NewClient(const ServerProcess& server, SharedMemory shared_memory) {
  ClientOptions options;
  options.timeout = std::chrono::seconds(60);
  options.shared_memory = shared_memory;
  return *Client::Create(server.target(), options);
}

// Tensor bytes the data channel received so far (0 before any).
double DataChannelBytes(const ServerProcess& server) {
  return std::max(0.0, Metric(server.http_port(), "attnserve_data_received_bytes_total"));
}

// The server's system shared memory regions (of token-less callers): name -> byte size.
std::map<std::string, uint64_t> Regions(const ServerProcess& server) {
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  inference::SystemSharedMemoryStatusRequest request;
  inference::SystemSharedMemoryStatusResponse response;
  const grpc::Status status = stub->SystemSharedMemoryStatus(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::map<std::string, uint64_t> regions;
  for (const auto& [name, region] : response.regions()) regions[name] = region.byte_size();
  return regions;
}

// This process's objects in /dev/shm.
std::set<std::string> ShmFiles() {
  const std::string prefix = "attnserve-" + std::to_string(getpid()) + "-";
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    if (name.rfind(prefix, 0) == 0) names.insert(name);
  }
  return names;
}

void ExpectSameTensor(const v1::Tensor& got, const v1::Tensor& want, const char* name) {
  EXPECT_EQ(got.dtype(), want.dtype()) << name;
  EXPECT_THAT(got.shape(), ::testing::ElementsAreArray(want.shape())) << name;
  EXPECT_TRUE(got.data() == want.data()) << name << " differs";
}

class ClientSharedMemoryE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServerProcess::Start(kAllow);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { EXPECT_THAT(ShmFiles(), ::testing::IsEmpty()); }

  // Forward then backward of `problem` on `shm` and on the native path (the data channel),
  // expecting the same bits, and no byte of `shm`'s on the data channel.
  void ExpectSameAnswers(Client& shm, const tools::Problem& problem) {
    std::unique_ptr<Client> native = NewClient(*server_, SharedMemory::kOff);
    const v1::ForwardRequest forward = problem.MakeForwardRequest();
    absl::StatusOr<v1::ForwardResponse> want = native->Forward(forward);
    ASSERT_TRUE(want.ok()) << want.status();
    const v1::BackwardRequest backward =
        problem.MakeBackwardRequest(*TensorToFloats(want->out()), *TensorToFloats(want->lse()));
    absl::StatusOr<v1::BackwardResponse> want_grads = native->Backward(backward);
    ASSERT_TRUE(want_grads.ok()) << want_grads.status();

    const double before = DataChannelBytes(*server_);
    absl::StatusOr<v1::ForwardResponse> got = shm.Forward(forward);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameTensor(got->out(), want->out(), "out");
    ExpectSameTensor(got->lse(), want->lse(), "lse");
    absl::StatusOr<v1::BackwardResponse> grads = shm.Backward(backward);
    ASSERT_TRUE(grads.ok()) << grads.status();
    ExpectSameTensor(grads->dq(), want_grads->dq(), "dq");
    ExpectSameTensor(grads->dk(), want_grads->dk(), "dk");
    ExpectSameTensor(grads->dv(), want_grads->dv(), "dv");
    EXPECT_EQ(DataChannelBytes(*server_), before);
  }

  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ClientSharedMemoryE2ETest, AnswersEqualTheNativePathBitwise) {
  std::unique_ptr<Client> shm = NewClient(*server_, SharedMemory::kOn);
  EXPECT_EQ(shm->ActiveTransport().value_or("?"), "shared memory");
  uint64_t seed = 1;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    for (bool window : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << dtype << " window " << window);
      ExpectSameAnswers(*shm, MakeProblem(dtype, seed++, 40, window));
    }
  }
  // Every call reused the one region registered by the first.
  EXPECT_EQ(Regions(*server_).size(), 1u);
}

TEST_F(ClientSharedMemoryE2ETest, ErrorsKeepTheNativeCodesAndMessages) {
  std::unique_ptr<Client> shm = NewClient(*server_, SharedMemory::kOn);
  std::unique_ptr<Client> native = NewClient(*server_, SharedMemory::kOff);
  v1::ForwardRequest wrong_offsets = MakeProblem(v1::DTYPE_FLOAT32, 7).MakeForwardRequest();
  wrong_offsets.set_cu_seqlens_q(1, 1000);  // past total_q
  const absl::Status want = native->Forward(wrong_offsets).status();
  const absl::Status got = shm->Forward(wrong_offsets).status();
  EXPECT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
  EXPECT_EQ(got, want);
  // Bytes that disagree with the shape go over the network, whose message names the field.
  v1::ForwardRequest short_bytes = MakeProblem(v1::DTYPE_FLOAT32, 8).MakeForwardRequest();
  short_bytes.mutable_v()->mutable_data()->resize(8);
  EXPECT_EQ(shm->Forward(short_bytes).status(), native->Forward(short_bytes).status());
  // An error keeps shared memory on.
  EXPECT_EQ(shm->ActiveTransport().value_or("?"), "shared memory");
}

TEST_F(ClientSharedMemoryE2ETest, TheRegionGrowsInWholeMebibytes) {
  std::unique_ptr<Client> shm = NewClient(*server_, SharedMemory::kOn);
  ExpectSameAnswers(*shm, MakeProblem(v1::DTYPE_FLOAT32, 11));
  std::map<std::string, uint64_t> small = Regions(*server_);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small.begin()->second, uint64_t{1} << 20);
  // q, k, v, out of ~512 tokens x 4 heads x 32 fp32 each: several MiB for the backward.
  ExpectSameAnswers(*shm, MakeProblem(v1::DTYPE_FLOAT32, 12, 600));
  std::map<std::string, uint64_t> large = Regions(*server_);
  ASSERT_EQ(large.size(), 1u);  // the small one went
  EXPECT_NE(large.begin()->first, small.begin()->first);
  EXPECT_GT(large.begin()->second, uint64_t{1} << 20);
  EXPECT_EQ(large.begin()->second % (uint64_t{1} << 20), 0u);
  EXPECT_EQ(ShmFiles(), std::set<std::string>{large.begin()->first});
}

TEST_F(ClientSharedMemoryE2ETest, ConcurrentCallsEachTakeARegion) {
  std::unique_ptr<Client> shm = NewClient(*server_, SharedMemory::kOn);
  std::unique_ptr<Client> native = NewClient(*server_, SharedMemory::kOff);
  constexpr int kCalls = 8;
  std::vector<std::shared_ptr<const v1::ForwardRequest>> requests;
  std::vector<std::future<absl::StatusOr<v1::ForwardResponse>>> pending;
  for (int i = 0; i < kCalls; ++i) {
    requests.push_back(std::make_shared<const v1::ForwardRequest>(
        MakeProblem(v1::DTYPE_BFLOAT16, 20 + i, 128).MakeForwardRequest()));
  }
  for (const auto& request : requests) pending.push_back(shm->ForwardFuture(request));
  std::vector<absl::StatusOr<v1::ForwardResponse>> answers;
  for (auto& answer : pending) answers.push_back(answer.get());
  EXPECT_EQ(DataChannelBytes(*server_), 0);
  const size_t regions = Regions(*server_).size();
  // The calls overlapped (all waited for the first registration), so several took a region.
  EXPECT_GE(regions, 2u);
  EXPECT_LE(regions, static_cast<size_t>(kCalls));
  EXPECT_EQ(ShmFiles().size(), regions);
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(answers[i].ok()) << answers[i].status();
    absl::StatusOr<v1::ForwardResponse> want = native->Forward(*requests[i]);
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectSameTensor(answers[i]->out(), want->out(), "out");
    ExpectSameTensor(answers[i]->lse(), want->lse(), "lse");
  }
}

TEST_F(ClientSharedMemoryE2ETest, DestroyingTheClientUnregistersAndUnlinks) {
  std::unique_ptr<Client> shm = NewClient(*server_, SharedMemory::kAuto);
  ExpectSameAnswers(*shm, MakeProblem(v1::DTYPE_FLOAT16, 30));
  EXPECT_EQ(Regions(*server_).size(), 1u);
  EXPECT_EQ(ShmFiles().size(), 1u);
  shm.reset();
  EXPECT_THAT(Regions(*server_), ::testing::IsEmpty());
  EXPECT_THAT(ShmFiles(), ::testing::IsEmpty());
}

TEST_F(ClientSharedMemoryE2ETest, ARestartedServerGetsTheRegionAgain) {
  std::unique_ptr<Client> shm = NewClient(*server_, SharedMemory::kOn);
  const tools::Problem problem = MakeProblem(v1::DTYPE_FLOAT32, 40);
  absl::StatusOr<v1::ForwardResponse> before = shm->Forward(problem.MakeForwardRequest());
  ASSERT_TRUE(before.ok()) << before.status();
  const std::map<std::string, uint64_t> registered = Regions(*server_);
  ASSERT_TRUE(server_->Restart());
  EXPECT_THAT(Regions(*server_), ::testing::IsEmpty());
  absl::StatusOr<v1::ForwardResponse> after = shm->Forward(problem.MakeForwardRequest());
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectSameTensor(after->out(), before->out(), "out");
  EXPECT_EQ(Regions(*server_), registered);  // the same region, registered again
  EXPECT_EQ(DataChannelBytes(*server_), 0);
}

TEST(ClientSharedMemoryFallbackE2ETest, AServerWithoutTheFlagGetsTheDataChannel) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> automatic = NewClient(*server, SharedMemory::kAuto);
  EXPECT_EQ(automatic->ActiveTransport().value_or("?"), "data channel (4 connection(s))");
  const v1::ForwardRequest request = MakeProblem(v1::DTYPE_FLOAT32, 50).MakeForwardRequest();
  EXPECT_TRUE(automatic->Forward(request).ok());
  EXPECT_GT(DataChannelBytes(*server), 0);

  std::unique_ptr<Client> insisting = NewClient(*server, SharedMemory::kOn);
  const absl::Status status = insisting->Forward(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("shared_memory=on: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("--allow_shared_memory"));
  EXPECT_THAT(ShmFiles(), ::testing::IsEmpty());
}

// Registration, calls and unregistration carry the client's token; a client without one is
// refused as on the native path.
TEST(ClientSharedMemoryTokenE2ETest, RegionsAndCallsCarryTheToken) {
  const std::string tokens = ::testing::TempDir() + "/shared_memory_tokens";
  std::ofstream(tokens) << "shm-e2e-token-5d1\n";
  ClientOptions with_token;
  with_token.timeout = std::chrono::seconds(60);
  with_token.bearer_token = "shm-e2e-token-5d1";
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({"--allow_shared_memory", "--auth_tokens_file=" + tokens}, with_token);
  ASSERT_NE(server, nullptr);
  const v1::ForwardRequest request = MakeProblem(v1::DTYPE_FLOAT32, 60).MakeForwardRequest();
  {
    with_token.shared_memory = SharedMemory::kOn;
    std::unique_ptr<Client> client = *Client::Create(server->target(), with_token);
    absl::StatusOr<v1::ForwardResponse> answer = client->Forward(request);
    EXPECT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(client->ActiveTransport().value_or("?"), "shared memory");
    EXPECT_EQ(ShmFiles().size(), 1u);
  }
  EXPECT_THAT(ShmFiles(), ::testing::IsEmpty());
  for (SharedMemory shared_memory : {SharedMemory::kAuto, SharedMemory::kOn}) {
    std::unique_ptr<Client> anonymous = NewClient(*server, shared_memory);
    const absl::Status status = anonymous->Forward(request).status();
    EXPECT_EQ(status, NewClient(*server, SharedMemory::kOff)->Forward(request).status());
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  }
  EXPECT_THAT(ShmFiles(), ::testing::IsEmpty());
}

TEST(ClientSharedMemoryFallbackE2ETest, ARemoteTargetIsNeverAsked) {
  // Nothing listens there: kOn fails before any call, kAuto goes to the network (and fails
  // there as any call would).
  ClientOptions options;
  options.timeout = std::chrono::seconds(2);
  options.shared_memory = SharedMemory::kOn;
  std::unique_ptr<Client> insisting = *Client::Create("attnserve.invalid:8001", options);
  const v1::ForwardRequest request = MakeProblem(v1::DTYPE_FLOAT32, 51).MakeForwardRequest();
  const absl::Status status = insisting->Forward(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("is not this host"));
}

TEST(ThisHostTest, LoopbackLocalhostAndThisHostSNameAreThisHost) {
  for (const char* host : {"127.0.0.1", "127.3.2.1", "[::1]", "::1", "localhost", "LocalHost",
                           "a.localhost"}) {
    EXPECT_TRUE(internal::IsThisHost(host)) << host;
  }
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  EXPECT_TRUE(internal::IsThisHost(name));
  for (const char* host : {"", "attnserve.invalid", "192.0.2.1", "[2001:db8::1]"}) {
    EXPECT_FALSE(internal::IsThisHost(host)) << host;
  }
}

}  // namespace
}  // namespace attnserve::testing
