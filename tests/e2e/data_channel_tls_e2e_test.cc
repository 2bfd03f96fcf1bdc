// End-to-end: TLS and mTLS on the data channel of the real server, spoken by attnserve::Client
// (which takes it by default with the gRPC channel's TLS files) and by DataChannelClient: the
// server's certificate and name are verified, a client without the certificate mTLS wants is
// refused, and every refusal says why.
#include <memory>

#include "attnserve/data_channel_client.h"
#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "test_certificates.h"
#include "tools/attention_problem.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

class DataChannelTlsE2ETest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certificates_ = new TestCertificates(); }
  static void TearDownTestSuite() {
    delete certificates_;
    certificates_ = nullptr;
  }
  static std::string Path(const std::string& name) { return certificates_->Path(name); }

  static TlsOptions ClientTls(bool with_certificate) {
    TlsOptions tls;
    tls.enabled = true;
    tls.root_certificates_file = Path("ca.crt");
    if (with_certificate) {
      tls.certificate_chain_file = Path("client.crt");
      tls.private_key_file = Path("client.key");
    }
    return tls;
  }

  // A server with TLS on both ports; `mutual` requires client certificates.
  static std::unique_ptr<ServerProcess> StartServer(bool mutual) {
    std::vector<std::string> flags = {"--tls_cert_file=" + Path("server.crt"),
                                      "--tls_key_file=" + Path("server.key")};
    if (mutual) flags.push_back("--tls_client_ca_file=" + Path("ca.crt"));
    ClientOptions options;
    options.tls = ClientTls(mutual);
    return ServerProcess::Start(flags, options);
  }

  // A session of one connection to the server's data port with `tls`.
  static absl::Status OpenSession(const ServerProcess& server, const TlsOptions& tls) {
    DataChannelOptions options;
    options.port = server.data_port();
    options.tls = tls;
    return DataChannelClient::Open(options).status();
  }

  static inline TestCertificates* certificates_ = nullptr;
};

v1::ForwardRequest SmallForward() {
  tools::ProblemSpec spec;
  spec.dtype = v1::DTYPE_FLOAT32;
  spec.num_heads = spec.num_heads_k = 2;
  spec.head_dim = 16;
  spec.max_seqlen_q = spec.max_seqlen_k = 32;
  return tools::MakeRandomProblem(spec).MakeForwardRequest();
}

void ExpectDataChannelAnswersAsGrpc(const ServerProcess& server) {
  // Open (HELLO_OK came back over TLS) before the call; the call then takes it.
  std::unique_ptr<Client> data = server.NewClient(Transport::kAuto);
  std::unique_ptr<Client> grpc = server.NewClient(Transport::kGrpc);
  EXPECT_EQ(data->ActiveTransport().value_or("?"), "data channel (4 connection(s))");
  const v1::ForwardRequest forward = SmallForward();
  absl::StatusOr<v1::ForwardResponse> got = data->Forward(forward);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<v1::ForwardResponse> want = grpc->Forward(forward);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(got->out().data(), want->out().data());
  EXPECT_EQ(got->lse().data(), want->lse().data());
}

TEST_F(DataChannelTlsE2ETest, TheClientTakesTheTlsDataChannelByDefault) {
  std::unique_ptr<ServerProcess> server = StartServer(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->NewClient()->GetServerInfo()->data_channel().tls());
  ExpectDataChannelAnswersAsGrpc(*server);
}

TEST_F(DataChannelTlsE2ETest, MutualTlsPresentsTheClientCertificate) {
  std::unique_ptr<ServerProcess> server = StartServer(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  ExpectDataChannelAnswersAsGrpc(*server);

  // Without the certificate the server refuses the session, and the error says so.
  const absl::Status refused = OpenSession(*server, ClientTls(/*with_certificate=*/false));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("the data channel at 127.0.0.1:"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("certificate"));
}

TEST_F(DataChannelTlsE2ETest, TheServerCertificateAndNameAreVerified) {
  std::unique_ptr<ServerProcess> server = StartServer(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(OpenSession(*server, ClientTls(false)).ok());  // 127.0.0.1, as the target

  TlsOptions named = ClientTls(false);
  named.server_name = "attnserve.test";  // a DNS name the certificate carries
  EXPECT_TRUE(OpenSession(*server, named).ok());

  TlsOptions wrong_ca = ClientTls(false);
  wrong_ca.root_certificates_file = Path("other_ca.crt");
  absl::Status refused = OpenSession(*server, wrong_ca);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("TLS handshake failed"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("server certificate"));

  TlsOptions wrong_name = ClientTls(false);
  wrong_name.server_name = "elsewhere.test";
  refused = OpenSession(*server, wrong_name);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("hostname mismatch"));

  TlsOptions missing_ca = ClientTls(false);
  missing_ca.root_certificates_file = Path("no_such_ca.crt");
  refused = OpenSession(*server, missing_ca);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("no_such_ca.crt"));

}

}  // namespace
}  // namespace attnserve::testing
