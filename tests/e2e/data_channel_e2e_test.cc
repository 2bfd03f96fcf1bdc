// End-to-end: the bulk data path of the real attnserve binary, spoken by the C++ client's
// DataChannelClient and, for protocol errors, frame by frame.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "attnserve/data_channel_client.h"
#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_metrics.h"
#include "server_process.h"
#include "shared_server_test.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

using data_channel::DataConnection;
using data_channel::FrameHeader;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

tools::Problem SmallProblem(v1::DType dtype, uint64_t seed) {
  tools::ProblemSpec spec;
  spec.dtype = dtype;
  spec.seed = seed;
  spec.causal = true;
  return tools::MakeRandomProblem(spec);
}

DataChannelOptions Options(const ServerProcess& server, int connections, int64_t chunk_bytes) {
  DataChannelOptions options;
  options.port = server.data_port();
  options.connections = connections;
  options.chunk_bytes = chunk_bytes;
  return options;
}

// A connection of a fresh session that has said HELLO and got HELLO_OK.
std::unique_ptr<DataConnection> Hello(const ServerProcess& server, const std::string& token = "") {
  absl::StatusOr<std::unique_ptr<DataConnection>> connection =
      DataConnection::Connect("127.0.0.1", server.data_port());
  EXPECT_TRUE(connection.ok()) << connection.status();
  if (!connection.ok()) return nullptr;
  const v1::DataHello hello = data_channel::MakeHello(data_channel::RandomSessionId(), token);
  EXPECT_TRUE((*connection)->SendMessage(v1::FRAME_HELLO, 0, hello).ok());
  absl::StatusOr<data_channel::Frame> ok = (*connection)->ReadFrame(kWait);
  EXPECT_TRUE(ok.ok()) << ok.status();
  if (!ok.ok()) return nullptr;
  EXPECT_EQ(ok->header.type, v1::FRAME_HELLO_OK);
  return *std::move(connection);
}

// Expects an ERROR frame with `code` whose message contains `text`, then the close.
void ExpectErrorAndClose(DataConnection& connection, absl::StatusCode code,
                         const std::string& text) {
  absl::StatusOr<data_channel::Frame> frame = connection.ReadFrame(kWait);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->header.type, v1::FRAME_ERROR);
  v1::DataError error;
  ASSERT_TRUE(error.ParseFromString(frame->payload));
  EXPECT_EQ(error.code(), static_cast<int>(code)) << error.message();
  EXPECT_THAT(error.message(), HasSubstr(text));
  EXPECT_TRUE(absl::IsUnavailable(connection.ReadFrame(kWait).status()));
}

v1::DataRequest Request(const data_channel::SplitCall& split, int64_t chunk_bytes) {
  v1::DataRequest request = split.request;
  int64_t total = 0;
  for (absl::string_view part : split.payload) total += static_cast<int64_t>(part.size());
  request.set_payload_bytes(total);
  request.set_chunk_bytes(chunk_bytes);
  return request;
}

class DataChannelE2ETest : public SharedServerTest {};

TEST_F(DataChannelE2ETest, ServerInfoAdvertisesTheDataChannel) {
  absl::StatusOr<v1::ServerInfo> info = server_->NewClient()->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->has_data_channel());
  EXPECT_EQ(info->data_channel().port(), server_->data_port());
  EXPECT_EQ(info->data_channel().protocol_version(), 1u);
  EXPECT_EQ(info->data_channel().max_chunk_bytes(), int64_t{16} << 20);
  EXPECT_EQ(info->data_channel().max_connections_per_session(), 16);
  EXPECT_FALSE(info->data_channel().tls());
}

// Three connections and a chunk size that divides no tensor: chunks start at odd offsets and
// straddle tensors; the answers are the gRPC answers byte for byte.
TEST_F(DataChannelE2ETest, ForwardAndBackwardEqualGrpcBitwise) {
  absl::StatusOr<std::unique_ptr<DataChannelClient>> data =
      DataChannelClient::Open(Options(*server_, 3, 100003));
  ASSERT_TRUE(data.ok()) << data.status();
  std::unique_ptr<Client> grpc = server_->NewClient();
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_BFLOAT16}) {
    const tools::Problem problem = SmallProblem(dtype, 7);
    const v1::ForwardRequest forward = problem.MakeForwardRequest();
    absl::StatusOr<v1::ForwardResponse> want = grpc->Forward(forward);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<v1::ForwardResponse> got = (*data)->Forward(forward);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->out().data(), want->out().data());
    EXPECT_EQ(got->lse().data(), want->lse().data());
    EXPECT_THAT(got->out().shape(), ::testing::ElementsAreArray(want->out().shape()));
    EXPECT_EQ(got->lse().dtype(), v1::DTYPE_FLOAT32);
    EXPECT_EQ(got->execution().kernel(), "reference");

    const v1::BackwardRequest backward = problem.MakeBackwardRequest(
        *TensorToFloats(want->out()), *TensorToFloats(want->lse()));
    absl::StatusOr<v1::BackwardResponse> want_grad = grpc->Backward(backward);
    ASSERT_TRUE(want_grad.ok()) << want_grad.status();
    absl::StatusOr<v1::BackwardResponse> got_grad = (*data)->Backward(backward);
    ASSERT_TRUE(got_grad.ok()) << got_grad.status();
    EXPECT_EQ(got_grad->dq().data(), want_grad->dq().data());
    EXPECT_EQ(got_grad->dk().data(), want_grad->dk().data());
    EXPECT_EQ(got_grad->dv().data(), want_grad->dv().data());
  }
  EXPECT_GT(Metric(server_->http_port(), "attnserve_data_received_bytes_total"), 0);
  EXPECT_GT(Metric(server_->http_port(), "attnserve_data_sent_bytes_total"), 0);
}

TEST_F(DataChannelE2ETest, SmallRequestTravelsInlineWithoutAccepted) {
  tools::ProblemSpec spec;
  spec.batch = 1;
  spec.max_seqlen_q = spec.max_seqlen_k = 8;
  spec.num_heads = spec.num_heads_k = 1;
  spec.head_dim = 16;
  const v1::ForwardRequest forward = tools::MakeRandomProblem(spec).MakeForwardRequest();
  std::unique_ptr<DataConnection> connection = Hello(*server_);
  ASSERT_NE(connection, nullptr);
  const data_channel::SplitCall split = data_channel::SplitForward(forward);
  const v1::DataRequest request = Request(split, 1 << 20);
  ASSERT_TRUE(connection->SendMessage(v1::FRAME_REQUEST, 5, request).ok());
  FrameHeader chunk;
  chunk.type = v1::FRAME_CHUNK;
  chunk.request_id = 5;
  chunk.length = request.payload_bytes();
  std::vector<iovec> parts;
  for (absl::string_view p : split.payload) parts.push_back({const_cast<char*>(p.data()), p.size()});
  ASSERT_TRUE(connection->SendFrame(chunk, parts).ok());
  // The RESPONSE and then its chunks (one connection: everything comes here), no ACCEPTED.
  absl::StatusOr<data_channel::Frame> frame = connection->ReadFrame(kWait);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->header.type, v1::FRAME_RESPONSE);
  v1::DataResponse response;
  ASSERT_TRUE(response.ParseFromString(frame->payload));
  EXPECT_EQ(response.code(), 0) << response.message();
  std::string bytes;
  while (static_cast<int64_t>(bytes.size()) < response.payload_bytes()) {
    absl::StatusOr<data_channel::Frame> data = connection->ReadFrame(kWait);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_EQ(data->header.type, v1::FRAME_CHUNK);
    EXPECT_EQ(data->header.offset, bytes.size());
    bytes += data->payload;
  }
  absl::StatusOr<v1::ForwardResponse> want = server_->NewClient()->Forward(forward);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(bytes, want->out().data() + want->lse().data());
}

TEST_F(DataChannelE2ETest, InlinePayloadOfSeveralChunksNeedsNoAccepted) {
  tools::ProblemSpec spec;
  spec.batch = 1;
  spec.dtype = v1::DTYPE_FLOAT32;
  spec.max_seqlen_q = spec.max_seqlen_k = 256;
  spec.num_heads = spec.num_heads_k = 4;
  spec.head_dim = 64;
  const v1::ForwardRequest forward = tools::MakeRandomProblem(spec).MakeForwardRequest();
  std::unique_ptr<DataConnection> connection = Hello(*server_);
  ASSERT_NE(connection, nullptr);
  const data_channel::SplitCall split = data_channel::SplitForward(forward);
  v1::DataRequest request = Request(split, 65536);
  ASSERT_GT(request.payload_bytes(), 65536);  // more than one chunk
  request.set_inline_payload(true);
  ASSERT_TRUE(connection->SendMessage(v1::FRAME_REQUEST, 9, request).ok());
  std::string payload;
  for (absl::string_view p : split.payload) payload.append(p.data(), p.size());
  for (size_t offset = 0; offset < payload.size(); offset += 65536) {
    FrameHeader chunk;
    chunk.type = v1::FRAME_CHUNK;
    chunk.request_id = 9;
    chunk.offset = offset;
    chunk.length = std::min<size_t>(65536, payload.size() - offset);
    const iovec part = {payload.data() + offset, chunk.length};
    ASSERT_TRUE(connection->SendFrame(chunk, absl::MakeConstSpan(&part, 1)).ok());
  }
  // No ACCEPTED: the RESPONSE, then the answer's CHUNKs, all on this connection.
  absl::StatusOr<data_channel::Frame> frame = connection->ReadFrame(kWait);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->header.type, v1::FRAME_RESPONSE);
  v1::DataResponse response;
  ASSERT_TRUE(response.ParseFromString(frame->payload));
  ASSERT_EQ(response.code(), 0) << response.message();
  std::string bytes;
  while (static_cast<int64_t>(bytes.size()) < response.payload_bytes()) {
    absl::StatusOr<data_channel::Frame> data = connection->ReadFrame(kWait);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_EQ(data->header.type, v1::FRAME_CHUNK);
    bytes += data->payload;
  }
  absl::StatusOr<v1::ForwardResponse> want = server_->NewClient()->Forward(forward);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(bytes, want->out().data() + want->lse().data());
}

struct BrokenFrame {
  const char* name;
  absl::StatusCode code;
  const char* message;
  // Sends the offending frames after HELLO; `request` is a valid REQUEST of `payload` bytes
  // in chunks of 65536.
  std::function<void(DataConnection&, const v1::DataRequest&)> send;
};

// Each protocol error gets ERROR and the close, while another session's calls go on.
TEST_F(DataChannelE2ETest, ProtocolErrorsCloseOnlyTheirConnection) {
  const tools::Problem problem = SmallProblem(v1::DTYPE_FLOAT32, 3);
  const v1::ForwardRequest forward = problem.MakeForwardRequest();
  const data_channel::SplitCall split = data_channel::SplitForward(forward);
  const v1::DataRequest request = Request(split, 65536);
  ASSERT_GT(request.payload_bytes(), 3 * 65536);
  auto send_request = [](DataConnection& c, const v1::DataRequest& r) {
    ASSERT_TRUE(c.SendMessage(v1::FRAME_REQUEST, 1, r).ok());
    absl::StatusOr<data_channel::Frame> accepted = c.ReadFrame(kWait);
    ASSERT_TRUE(accepted.ok()) << accepted.status();
    ASSERT_EQ(accepted->header.type, v1::FRAME_ACCEPTED);
  };
  auto chunk = [](DataConnection& c, uint64_t id, uint64_t offset, uint64_t length) {
    FrameHeader header;
    header.type = v1::FRAME_CHUNK;
    header.request_id = id;
    header.offset = offset;
    header.length = length;
    std::string zeros(length, '\0');
    const iovec part = {zeros.data(), zeros.size()};
    (void)c.SendFrame(header, absl::MakeConstSpan(&part, 1));
  };
  const std::vector<BrokenFrame> cases = {
      {"bad magic", absl::StatusCode::kInvalidArgument, "magic",
       [](DataConnection& c, const v1::DataRequest&) {
         FrameHeader header;
         header.type = v1::FRAME_REQUEST;
         ASSERT_TRUE(c.SendRaw(data_channel::EncodeHeader(header, 0xdeadbeef)).ok());
       }},
      {"oversize message", absl::StatusCode::kInvalidArgument, "exceeds the 1048576-byte limit",
       [](DataConnection& c, const v1::DataRequest&) {
         FrameHeader header;
         header.type = v1::FRAME_REQUEST;
         header.request_id = 1;
         header.length = 2 << 20;
         ASSERT_TRUE(c.SendRaw(data_channel::EncodeHeader(header)).ok());
       }},
      {"chunk out of range", absl::StatusCode::kInvalidArgument, "beyond the payload",
       [&](DataConnection& c, const v1::DataRequest& r) {
         send_request(c, r);
         chunk(c, 1, 64 * 65536, 65536);
       }},
      {"duplicate chunk", absl::StatusCode::kInvalidArgument, "already sent",
       [&](DataConnection& c, const v1::DataRequest& r) {
         send_request(c, r);
         chunk(c, 1, 65536, 65536);
         chunk(c, 1, 65536, 65536);
       }},
      {"wrong length", absl::StatusCode::kInvalidArgument, "must carry 65536 bytes",
       [&](DataConnection& c, const v1::DataRequest& r) {
         send_request(c, r);
         chunk(c, 1, 0, 65535);
       }},
      {"unknown request id", absl::StatusCode::kInvalidArgument, "request_id 999",
       [&](DataConnection& c, const v1::DataRequest&) { chunk(c, 999, 0, 16); }},
  };
  absl::StatusOr<std::unique_ptr<DataChannelClient>> bystander =
      DataChannelClient::Open(Options(*server_, 2, 65536));
  ASSERT_TRUE(bystander.ok()) << bystander.status();
  std::atomic<bool> done{false};
  std::atomic<int> bystander_calls{0};
  std::thread traffic([&] {
    while (!done) {
      absl::StatusOr<v1::ForwardResponse> response = (*bystander)->Forward(forward);
      ASSERT_TRUE(response.ok()) << response.status();
      ++bystander_calls;
    }
  });
  for (const BrokenFrame& broken : cases) {
    SCOPED_TRACE(broken.name);
    std::unique_ptr<DataConnection> connection = Hello(*server_);
    ASSERT_NE(connection, nullptr);
    broken.send(*connection, request);
    ExpectErrorAndClose(*connection, broken.code, broken.message);
  }
  while (bystander_calls < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  done = true;
  traffic.join();
  EXPECT_EQ(AwaitMetric(server_->http_port(), "attnserve_data_buffered_bytes", 0), 0);
}

// A client that dies mid-transfer leaves no buffer and no slot behind; until then its call
// holds one of max_concurrent_requests' slots, shared with gRPC.
TEST(DataChannelLimitsE2ETest, KilledClientFreesBufferAndSlot) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(
      {"--max_concurrent_requests=1", "--max_message_bytes=4194304"});
  ASSERT_NE(server, nullptr);
  tools::ProblemSpec spec;
  spec.num_heads = spec.num_heads_k = 4;
  spec.head_dim = 32;
  spec.dtype = v1::DTYPE_FLOAT32;
  const v1::ForwardRequest big =
      tools::MakeRandomProblem(spec, {2048}, {2048}).MakeForwardRequest();
  const data_channel::SplitCall split = data_channel::SplitForward(big);
  const v1::DataRequest request = Request(split, 65536);
  ASSERT_GT(request.payload_bytes(), 2 << 20);
  ASSERT_LT(request.payload_bytes(), 4 << 20);
  {
    std::unique_ptr<DataConnection> connection = Hello(*server);
    ASSERT_NE(connection, nullptr);
    ASSERT_TRUE(connection->SendMessage(v1::FRAME_REQUEST, 1, request).ok());
    absl::StatusOr<data_channel::Frame> accepted = connection->ReadFrame(kWait);
    ASSERT_TRUE(accepted.ok());
    ASSERT_EQ(accepted->header.type, v1::FRAME_ACCEPTED);
    FrameHeader header;
    header.type = v1::FRAME_CHUNK;
    header.request_id = 1;
    header.length = 65536;
    const iovec part = {const_cast<char*>(split.payload[0].data()), 65536};
    ASSERT_TRUE(connection->SendFrame(header, absl::MakeConstSpan(&part, 1)).ok());
    EXPECT_EQ(AwaitMetric(server->http_port(), "attnserve_data_buffered_bytes",
                          request.payload_bytes()),
              request.payload_bytes());
    absl::StatusOr<v1::ForwardResponse> refused = server->NewClient()->Forward(big);
    EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  }  // the connection closes as a killed client's would
  EXPECT_EQ(AwaitMetric(server->http_port(), "attnserve_data_buffered_bytes", 0), 0);
  EXPECT_EQ(AwaitMetric(server->http_port(), "attnserve_data_sessions", 0), 0);
  absl::StatusOr<v1::ForwardResponse> served = server->NewClient()->Forward(big);
  EXPECT_TRUE(served.ok()) << served.status();

  // Over max_message_bytes: refused at the REQUEST, before any payload (no ACCEPTED).
  const v1::ForwardRequest huge =
      tools::MakeRandomProblem(spec, {4096}, {4096}).MakeForwardRequest();
  std::unique_ptr<DataConnection> connection = Hello(*server);
  ASSERT_NE(connection, nullptr);
  ASSERT_TRUE(connection
                  ->SendMessage(v1::FRAME_REQUEST, 2,
                                Request(data_channel::SplitForward(huge), 65536))
                  .ok());
  absl::StatusOr<data_channel::Frame> refusal = connection->ReadFrame(kWait);
  ASSERT_TRUE(refusal.ok());
  ASSERT_EQ(refusal->header.type, v1::FRAME_RESPONSE);
  v1::DataResponse response;
  ASSERT_TRUE(response.ParseFromString(refusal->payload));
  EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(response.message(), HasSubstr("max_message_bytes"));
  EXPECT_THAT(response.message(), HasSubstr("payload_bytes"));
}

TEST(DataChannelAuthE2ETest, TokensAreCheckedAtHello) {
  char path[] = "/tmp/attnserve_data_tokens_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "data-channel-secret\n";
  ClientOptions client_options;
  client_options.bearer_token = "data-channel-secret";
  std::unique_ptr<ServerProcess> server =
      ServerProcess::Start({std::string("--auth_tokens_file=") + path}, client_options);
  ASSERT_NE(server, nullptr);
  DataChannelOptions options = Options(*server, 2, 65536);
  options.bearer_token = "wrong";
  EXPECT_TRUE(absl::IsUnauthenticated(DataChannelClient::Open(options).status()));
  options.bearer_token = "";
  EXPECT_TRUE(absl::IsUnauthenticated(DataChannelClient::Open(options).status()));
  options.bearer_token = "data-channel-secret";
  absl::StatusOr<std::unique_ptr<DataChannelClient>> client = DataChannelClient::Open(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Forward(SmallProblem(v1::DTYPE_FLOAT16, 1).MakeForwardRequest()).ok());
  unlink(path);
}

}  // namespace
}  // namespace attnserve::testing
