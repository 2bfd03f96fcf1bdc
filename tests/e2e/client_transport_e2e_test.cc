// End-to-end: which transport attnserve::Client takes (ClientOptions::transport) against the
// real server: the data channel by default when the server offers one, gRPC when it does not
// or cannot be reached, the same answers and error codes on both, futures, and saved contexts
// over the data channel (only dout sent, the full resend when the context is gone). The
// server's data-path byte counter tells which path the tensors took.
#include <future>
#include <memory>

#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_metrics.h"
#include "server_process.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kReceived[] = "attnserve_data_received_bytes_total";

tools::Problem SmallProblem(uint64_t seed) {
  tools::ProblemSpec spec;
  spec.dtype = v1::DTYPE_FLOAT32;
  spec.batch = 2;
  spec.max_seqlen_q = 24;
  spec.max_seqlen_k = 40;
  spec.num_heads = 4;
  spec.num_heads_k = 2;
  spec.head_dim = 16;
  spec.causal = true;
  spec.seed = seed;
  return tools::MakeRandomProblem(spec);
}

// Tensor bytes the data channel received so far (0 before any).
double Received(const ServerProcess& server) {
  return std::max(0.0, Metric(server.http_port(), kReceived));
}

int64_t Bytes(std::initializer_list<const v1::Tensor*> tensors) {
  int64_t total = 0;
  for (const v1::Tensor* t : tensors) total += static_cast<int64_t>(t->data().size());
  return total;
}

TEST(ClientTransportE2ETest, TheDataChannelIsTheDefaultAndAnswersAsGrpcDoes) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> data = *Client::Create(server->target());  // default options
  std::unique_ptr<Client> grpc = server->NewClient(Transport::kGrpc);
  EXPECT_EQ(data->ActiveTransport().value_or("?"), "data channel (4 connection(s))");
  EXPECT_EQ(grpc->ActiveTransport().value_or("?"), "grpc");

  const tools::Problem problem = SmallProblem(1);
  const v1::ForwardRequest forward = problem.MakeForwardRequest();
  absl::StatusOr<v1::ForwardResponse> want = grpc->Forward(forward);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(Received(*server), 0) << "transport=grpc used the data channel";
  absl::StatusOr<v1::ForwardResponse> got = data->Forward(forward);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->out().data(), want->out().data());
  EXPECT_EQ(got->lse().data(), want->lse().data());
  EXPECT_THAT(got->out().shape(), ::testing::ElementsAreArray(want->out().shape()));
  EXPECT_EQ(got->execution().kernel(), "reference");
  EXPECT_EQ(Received(*server), Bytes({&forward.q(), &forward.k(), &forward.v()}));

  const v1::BackwardRequest backward =
      problem.MakeBackwardRequest(*TensorToFloats(want->out()), *TensorToFloats(want->lse()));
  absl::StatusOr<v1::BackwardResponse> want_grads = grpc->Backward(backward);
  ASSERT_TRUE(want_grads.ok()) << want_grads.status();
  const double before = Received(*server);
  absl::StatusOr<v1::BackwardResponse> grads = data->Backward(backward);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(grads->dq().data(), want_grads->dq().data());
  EXPECT_EQ(grads->dk().data(), want_grads->dk().data());
  EXPECT_EQ(grads->dv().data(), want_grads->dv().data());
  EXPECT_EQ(Received(*server) - before,
            Bytes({&backward.dout(), &backward.q(), &backward.k(), &backward.v(),
                   &backward.out(), &backward.lse()}));
}

TEST(ClientTransportE2ETest, ErrorsKeepTheirCodesAndMessagesOnBothTransports) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  v1::ForwardRequest wrong_offsets = SmallProblem(2).MakeForwardRequest();
  wrong_offsets.set_cu_seqlens_q(1, 1000);  // past total_q
  v1::ForwardRequest short_bytes = SmallProblem(3).MakeForwardRequest();
  short_bytes.mutable_v()->mutable_data()->resize(8);
  for (Transport transport : {Transport::kDataChannel, Transport::kGrpc}) {
    std::unique_ptr<Client> client = server->NewClient(transport);
    const absl::Status offsets = client->Forward(wrong_offsets).status();
    EXPECT_EQ(offsets.code(), absl::StatusCode::kInvalidArgument) << offsets;
    EXPECT_THAT(std::string(offsets.message()), HasSubstr("cu_seqlens_q"));
    // Bytes that disagree with the shape go over gRPC, whose message names the field.
    const absl::Status bytes = client->Forward(short_bytes).status();
    EXPECT_EQ(bytes.code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(std::string(bytes.message()), HasSubstr("v"));
  }
}

TEST(ClientTransportE2ETest, GrpcWhenTheServerOffersNoDataChannel) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--data_port=0"});
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->NewClient(Transport::kAuto);
  EXPECT_EQ(client->ActiveTransport().value_or("?"), "grpc");
  EXPECT_TRUE(client->Forward(SmallProblem(4).MakeForwardRequest()).ok());

  std::unique_ptr<Client> insisting = server->NewClient(Transport::kDataChannel);
  const absl::Status status = insisting->Forward(SmallProblem(4).MakeForwardRequest()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("transport=data: the server advertises no data channel"));
}

// The server takes one data connection, so a session of two cannot open: auto goes over gRPC
// and stays there, transport=data fails saying where it could not connect.
TEST(ClientTransportE2ETest, GrpcWhenTheDataChannelCannotBeOpened) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--data_max_connections=1"});
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.data_connections = 2;
  std::unique_ptr<Client> client = *Client::Create(server->target(), options);
  const v1::ForwardRequest forward = SmallProblem(5).MakeForwardRequest();
  EXPECT_TRUE(client->Forward(forward).ok());
  EXPECT_EQ(client->ActiveTransport().value_or("?"), "grpc");
  EXPECT_EQ(Received(*server), 0);

  options.transport = Transport::kDataChannel;
  std::unique_ptr<Client> insisting = *Client::Create(server->target(), options);
  const absl::Status status = insisting->Forward(forward).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot open the data channel at 127.0.0.1:"));
}

TEST(ClientTransportE2ETest, FuturesOverlapAndAnswerOnBothTransports) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  for (Transport transport : {Transport::kDataChannel, Transport::kGrpc}) {
    std::unique_ptr<Client> client = server->NewClient(transport);
    std::vector<std::shared_ptr<const v1::ForwardRequest>> requests;
    std::vector<std::future<absl::StatusOr<v1::ForwardResponse>>> pending;
    for (int i = 0; i < 8; ++i) {
      v1::ForwardRequest request = SmallProblem(10 + i).MakeForwardRequest();
      request.set_keep_context(true);
      requests.push_back(std::make_shared<const v1::ForwardRequest>(std::move(request)));
      pending.push_back(client->ForwardFuture(requests.back()));
    }
    std::vector<std::future<absl::StatusOr<v1::BackwardResponse>>> grads;
    for (int i = 0; i < 8; ++i) {
      absl::StatusOr<v1::ForwardResponse> answer = pending[i].get();
      ASSERT_TRUE(answer.ok()) << answer.status();
      ASSERT_FALSE(answer->context_id().empty());
      EXPECT_EQ(answer->out().data(), client->Forward(*requests[i])->out().data());
      auto dout = std::make_shared<const v1::Tensor>(requests[i]->q());
      grads.push_back(client->BackwardOnContextFuture(
          requests[i], std::make_shared<const v1::ForwardResponse>(*std::move(answer)), dout));
    }
    for (int i = 0; i < 8; ++i) {
      absl::StatusOr<v1::BackwardResponse> r = grads[i].get();
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->dk().data().size(), requests[i]->k().data().size());
    }
  }
}

// On the data channel a backward on a context moves dout only, and one whose context is gone
// is sent in full, with the same gradients.
TEST(ClientTransportE2ETest, ContextBackwardsSendDoutOnlyAndResendInFullOverTheDataChannel) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = server->NewClient(Transport::kDataChannel);
  const tools::Problem problem = SmallProblem(20);
  v1::ForwardRequest forward = problem.MakeForwardRequest();
  forward.set_keep_context(true);
  const v1::Tensor dout = forward.q();  // any tensor of q's shape

  absl::StatusOr<v1::ForwardResponse> answer = client->Forward(forward);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_FALSE(answer->context_id().empty());
  const v1::BackwardResponse full =
      *server->NewClient(Transport::kGrpc)->Backward(FullBackwardRequest(forward, *answer, dout));

  double before = Received(*server);
  absl::StatusOr<v1::BackwardResponse> fast = client->BackwardOnContext(forward, *answer, dout);
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->dq().data(), full.dq().data());
  EXPECT_EQ(fast->dk().data(), full.dk().data());
  EXPECT_EQ(fast->dv().data(), full.dv().data());
  EXPECT_EQ(Received(*server) - before, Bytes({&dout}));

  // The context was used up: the same backward again is resent in full, unnoticed.
  before = Received(*server);
  absl::StatusOr<v1::BackwardResponse> resent = client->BackwardOnContext(forward, *answer, dout);
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_EQ(resent->dq().data(), full.dq().data());
  EXPECT_EQ(resent->dv().data(), full.dv().data());
  EXPECT_EQ(Received(*server) - before,
            Bytes({&dout}) + Bytes({&dout, &forward.q(), &forward.k(), &forward.v(),
                                    &answer->out(), &answer->lse()}));
}

}  // namespace
}  // namespace attnserve::testing
