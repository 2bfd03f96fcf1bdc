// End-to-end: saved contexts on the real attnserve binary (CPU device) over gRPC, and the C++
// client's backward on a context, which resends in full when the context is gone.
#include "absl/strings/str_cat.h"
#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "shared_server_test.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

// A float32 problem, its forward request (keeping its context) and dout.
struct ContextProblem {
  explicit ContextProblem(uint64_t seed) {
    tools::ProblemSpec spec;
    spec.dtype = v1::DTYPE_FLOAT32;
    spec.batch = 3;
    spec.max_seqlen_q = 29;
    spec.max_seqlen_k = 41;
    spec.num_heads = 4;
    spec.num_heads_k = 2;
    spec.head_dim = 16;
    spec.causal = true;
    spec.softcap = 6.0f;
    spec.seed = seed;
    problem = tools::MakeRandomProblem(spec);
    forward = problem.MakeForwardRequest();
    forward.set_keep_context(true);
    const std::vector<int64_t> shape(forward.q().shape().begin(), forward.q().shape().end());
    dout = *MakeTensor(spec.dtype, shape, problem.dout);
  }

  v1::BackwardRequest OnlyDout(const std::string& id) const {
    v1::BackwardRequest request;
    *request.mutable_dout() = dout;
    request.set_context_id(id);
    return request;
  }

  tools::Problem problem;
  v1::ForwardRequest forward;
  v1::Tensor dout;
};

void ExpectSameGradients(const v1::BackwardResponse& got, const v1::BackwardResponse& want) {
  EXPECT_EQ(got.dq().shape_size(), 3);
  EXPECT_EQ(got.dq().data(), want.dq().data());
  EXPECT_EQ(got.dk().data(), want.dk().data());
  EXPECT_EQ(got.dv().data(), want.dv().data());
  EXPECT_THAT(got.dq().shape(), ::testing::ElementsAreArray(want.dq().shape()));
  EXPECT_THAT(got.dk().shape(), ::testing::ElementsAreArray(want.dk().shape()));
}

class ContextE2ETest : public SharedServerTest {};

TEST_F(ContextE2ETest, ABackwardWithOnlyDoutEqualsTheFullBackwardBitwise) {
  const ContextProblem p(11);
  absl::StatusOr<v1::ForwardResponse> answer = client_->Forward(p.forward);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->context_id().size(), 32u);
  EXPECT_TRUE(answer->context_address().empty());  // no --advertise_address

  absl::StatusOr<v1::BackwardResponse> full =
      client_->Backward(FullBackwardRequest(p.forward, *answer, p.dout));
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<v1::BackwardResponse> by_context =
      client_->Backward(p.OnlyDout(answer->context_id()));
  ASSERT_TRUE(by_context.ok()) << by_context.status();
  ExpectSameGradients(*by_context, *full);
  EXPECT_EQ(by_context->execution().kernel(), "reference");
}

TEST_F(ContextE2ETest, UnknownOrUsedContextsAreNotFoundNamingTheId) {
  absl::Status s = client_->Backward(ContextProblem(12).OnlyDout("feedfacefeedface")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("feedfacefeedface"));

  const ContextProblem p(13);
  const std::string id = client_->Forward(p.forward)->context_id();
  ASSERT_TRUE(client_->Backward(p.OnlyDout(id)).ok());
  s = client_->Backward(p.OnlyDout(id)).status();  // its backward released it
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(id));
}

TEST_F(ContextE2ETest, ReleaseContextFreesIt) {
  const ContextProblem p(14);
  const std::string id = client_->Forward(p.forward)->context_id();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(client_->ReleaseContext(id).value_or(false), true);
  EXPECT_EQ(client_->ReleaseContext(id).value_or(true), false);
  EXPECT_EQ(client_->Backward(p.OnlyDout(id)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->ReleaseContext("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ContextE2ETest, FieldsThatDisagreeAreInvalidArgumentNamingTheField) {
  const ContextProblem p(15);
  absl::StatusOr<v1::ForwardResponse> answer = client_->Forward(p.forward);
  v1::BackwardRequest request = p.OnlyDout(answer->context_id());
  request.add_cu_seqlens_q(0);
  const absl::Status s = client_->Backward(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cu_seqlens_q"));
  EXPECT_TRUE(client_->Backward(p.OnlyDout(answer->context_id())).ok());  // still there
}

TEST_F(ContextE2ETest, TheClientResendsInFullWhenTheContextIsGone) {
  const ContextProblem p(16);
  absl::StatusOr<v1::ForwardResponse> answer = client_->Forward(p.forward);
  ASSERT_TRUE(answer.ok());
  const v1::BackwardResponse full =
      *client_->Backward(FullBackwardRequest(p.forward, *answer, p.dout));
  ASSERT_EQ(client_->ReleaseContext(answer->context_id()).value_or(false), true);
  absl::StatusOr<v1::BackwardResponse> resent =
      client_->BackwardOnContext(p.forward, *answer, p.dout);
  ASSERT_TRUE(resent.ok()) << resent.status();
  ExpectSameGradients(*resent, full);

  // No context kept at all (a forward without keep_context): the full backward at once.
  v1::ForwardRequest plain = p.forward;
  plain.set_keep_context(false);
  absl::StatusOr<v1::ForwardResponse> plain_answer = client_->Forward(plain);
  ASSERT_TRUE(plain_answer->context_id().empty());
  resent = client_->BackwardOnContext(plain, *plain_answer, p.dout);
  ASSERT_TRUE(resent.ok()) << resent.status();
  ExpectSameGradients(*resent, full);

  // The fast path: the context is there and used.
  answer = client_->Forward(p.forward);
  absl::StatusOr<v1::BackwardResponse> fast = client_->BackwardOnContext(p.forward, *answer, p.dout);
  ASSERT_TRUE(fast.ok()) << fast.status();
  ExpectSameGradients(*fast, full);
  EXPECT_EQ(client_->ReleaseContext(answer->context_id()).value_or(true), false);  // used up
}

TEST(ContextTtlE2ETest, ExpiredContextsAreNotFoundAndTheLimitsAreReported) {
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({"--context_ttl_seconds=1", "--context_memory_bytes=100000000"});
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->NewClient();
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->limits().context_ttl_seconds(), 1);
  EXPECT_EQ(info->limits().context_memory_bytes(), 100000000);
  const ContextProblem p(17);
  const std::string id = client->Forward(p.forward)->context_id();
  ASSERT_FALSE(id.empty());
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(client->Backward(p.OnlyDout(id)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(server->Terminate(), 0);
}

// Two replicas that advertise their own addresses: a client of one sends the backward of a
// context the other keeps to that other, and one whose replica cannot be reached goes in full.
TEST(ContextReplicasE2ETest, TheBackwardFollowsTheContextAddress) {
  const std::string advertise = std::string("--advertise_address=127.0.0.1:") +
                                kGrpcPortPlaceholder;
  std::unique_ptr<ServerProcess> a = ServerProcess::Start({advertise});
  std::unique_ptr<ServerProcess> b = ServerProcess::Start({advertise});
  ASSERT_TRUE(a != nullptr && b != nullptr);
  std::unique_ptr<Client> client_a = a->NewClient(), client_b = b->NewClient();
  EXPECT_EQ(client_a->GetServerInfo()->address(), a->target());

  const ContextProblem p(18);
  absl::StatusOr<v1::ForwardResponse> answer = client_a->Forward(p.forward);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->context_address(), a->target());
  const v1::BackwardResponse full =
      *client_b->Backward(FullBackwardRequest(p.forward, *answer, p.dout));
  absl::StatusOr<v1::BackwardResponse> followed =
      client_b->BackwardOnContext(p.forward, *answer, p.dout);
  ASSERT_TRUE(followed.ok()) << followed.status();
  ExpectSameGradients(*followed, full);
  // Used on a (had it gone to b, b would have answered in full and a would still hold it).
  EXPECT_EQ(client_a->ReleaseContext(answer->context_id()).value_or(true), false);

  v1::ForwardResponse unreachable = *client_a->Forward(p.forward);
  const std::string id = unreachable.context_id();
  unreachable.set_context_address(absl::StrCat("127.0.0.1:", FreePort()));
  absl::StatusOr<v1::BackwardResponse> resent =
      client_b->BackwardOnContext(p.forward, unreachable, p.dout);
  ASSERT_TRUE(resent.ok()) << resent.status();
  ExpectSameGradients(*resent, full);
  EXPECT_EQ(client_a->ReleaseContext(id).value_or(false), true);  // left to its TTL otherwise

  EXPECT_EQ(a->Terminate(), 0);
  EXPECT_EQ(b->Terminate(), 0);
}

}  // namespace
}  // namespace attnserve::testing
