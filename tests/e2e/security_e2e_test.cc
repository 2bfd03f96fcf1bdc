// End-to-end: attnctl, attnload and the C++ client against a server with TLS, mTLS and bearer
// tokens, using throwaway certificates made with the openssl command line.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "subprocess.h"
#include "test_certificates.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "e2e-host-token-91c2";

// A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and an
// unrelated CA; made once for the whole suite.
class SecurityE2ETest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certificates_ = new TestCertificates();
    WriteFile(Path("tokens"), std::string("# e2e\n") + kToken + "\n");
    WriteFile(Path("token"), std::string(kToken) + "\n");
  }
  static void TearDownTestSuite() {
    delete certificates_;
    certificates_ = nullptr;
  }
  static std::string Path(const std::string& name) { return certificates_->Path(name); }

  // Starts a TLS server with tokens; `mutual` requires client certificates too.
  std::unique_ptr<ServerProcess> StartServer(bool mutual) {
    std::vector<std::string> flags = {"--tls_cert_file=" + Path("server.crt"),
                                      "--tls_key_file=" + Path("server.key"),
                                      "--auth_tokens_file=" + Path("tokens")};
    if (mutual) flags.push_back("--tls_client_ca_file=" + Path("ca.crt"));
    return ServerProcess::Start(flags, ClientSideOptions(mutual));
  }

  static ClientOptions ClientSideOptions(bool with_certificate) {
    ClientOptions options;
    options.tls.enabled = true;
    options.tls.root_certificates_file = Path("ca.crt");
    if (with_certificate) {
      options.tls.certificate_chain_file = Path("client.crt");
      options.tls.private_key_file = Path("client.key");
    }
    options.bearer_token = kToken;
    return options;
  }

  // The tool with `flags`, without any $ATTNSERVE_TOKEN of the test's own environment.
  static ProcessResult RunTool(const std::string& binary, const std::string& target,
                               std::vector<std::string> flags, const std::string& env = "") {
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "ATTNSERVE_TOKEN"};
    if (!env.empty()) argv.push_back(env);
    argv.push_back(binary);
    argv.push_back("--target=" + target);
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunProcess(argv, 120);
  }

  static inline TestCertificates* certificates_ = nullptr;
};

TEST_F(SecurityE2ETest, AttnctlWorksWithTlsAndATokenFileOrTheEnvironment) {
  auto server = StartServer(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  const std::string ca = "--tls_ca_file=" + Path("ca.crt");
  ProcessResult info = RunTool(ATTNCTL_BIN, server->target(),
                               {ca, "--token_file=" + Path("token"), "info"});
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_THAT(info.output, HasSubstr("\"version\""));
  ProcessResult forward =
      RunTool(ATTNCTL_BIN, server->target(),
              {ca, "--tls_server_name=attnserve.test", "forward", "--check", "--dtype=fp32",
               "--heads=2", "--head_dim=16", "--seqlen_q=16", "--seqlen_k=16"},
              std::string("ATTNSERVE_TOKEN=") + kToken);
  EXPECT_EQ(forward.exit_code, 0) << forward.output;
  EXPECT_THAT(forward.output, HasSubstr("ok"));
}

TEST_F(SecurityE2ETest, AttnctlFailsClearlyWithoutTheTokenOrWithoutTls) {
  auto server = StartServer(/*mutual=*/false);
  ASSERT_NE(server, nullptr);
  ProcessResult no_token =
      RunTool(ATTNCTL_BIN, server->target(), {"--tls_ca_file=" + Path("ca.crt"), "info"});
  EXPECT_EQ(no_token.exit_code, 1) << no_token.output;
  EXPECT_THAT(no_token.output, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(no_token.output, HasSubstr("Bearer"));
  ProcessResult plaintext = RunTool(ATTNCTL_BIN, server->target(),
                                    {"--token_file=" + Path("token"), "--timeout_ms=5000", "info"});
  EXPECT_EQ(plaintext.exit_code, 1) << plaintext.output;
  EXPECT_THAT(plaintext.output, HasSubstr("UNAVAILABLE"));
  ProcessResult wrong_ca = RunTool(
      ATTNCTL_BIN, server->target(),
      {"--tls_ca_file=" + Path("other_ca.crt"), "--token_file=" + Path("token"), "info"});
  EXPECT_EQ(wrong_ca.exit_code, 1) << wrong_ca.output;
  EXPECT_THAT(wrong_ca.output, HasSubstr("UNAVAILABLE"));
  ProcessResult missing_file = RunTool(
      ATTNCTL_BIN, server->target(),
      {"--tls_ca_file=" + Path("ca.crt"), "--token_file=" + Path("no_such_token"), "info"});
  EXPECT_EQ(missing_file.exit_code, 2) << missing_file.output;
  EXPECT_THAT(missing_file.output, HasSubstr("no_such_token"));
}

TEST_F(SecurityE2ETest, AttnloadRunsOverMtlsAndRefusesToStartWithoutTheClientCertificate) {
  auto server = StartServer(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  const std::vector<std::string> load = {"--shape=fixed:batch=1,seqlen=16", "--heads=2",
                                         "--head_dim=16", "--pool_size=2", "--warmup=100ms",
                                         "--duration=500ms", "--progress=false",
                                         "--dtype=fp32", "--check=5",
                                         "--tls_ca_file=" + Path("ca.crt"),
                                         "--token_file=" + Path("token")};
  std::vector<std::string> mtls = load;
  mtls.push_back("--tls_cert_file=" + Path("client.crt"));
  mtls.push_back("--tls_key_file=" + Path("client.key"));
  ProcessResult ok = RunTool(ATTNLOAD_BIN, server->target(), mtls);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, ::testing::Not(HasSubstr(kToken)));
  ProcessResult refused = RunTool(ATTNLOAD_BIN, server->target(), load);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("cannot reach attnserve"));
}

TEST_F(SecurityE2ETest, TheClientLibraryNeedsTheRightCaCertificateAndToken) {
  auto server = StartServer(/*mutual=*/true);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->NewClient()->GetServerInfo().ok());

  ClientOptions wrong_token = ClientSideOptions(true);
  wrong_token.bearer_token = "not-the-token";
  auto client = Client::Create(server->target(), wrong_token);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);

  ClientOptions no_certificate = ClientSideOptions(false);
  client = Client::Create(server->target(), no_certificate);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);

  ClientOptions missing_ca = ClientSideOptions(true);
  missing_ca.tls.root_certificates_file = Path("no_such_ca.crt");
  EXPECT_EQ(Client::Create(server->target(), missing_ca).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A context belongs to the token that kept it; ReleaseContext needs a token like Forward.
TEST_F(SecurityE2ETest, ContextsAreTheirTokensOwn) {
  WriteFile(Path("two_tokens"), std::string(kToken) + "\nsecond-e2e-token\n");
  ClientOptions options = ClientSideOptions(false);
  auto server = ServerProcess::Start({"--tls_cert_file=" + Path("server.crt"),
                                      "--tls_key_file=" + Path("server.key"),
                                      "--auth_tokens_file=" + Path("two_tokens")},
                                     options);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> owner = server->NewClient();
  options.bearer_token = "second-e2e-token";
  std::unique_ptr<Client> other = *Client::Create(server->target(), options);
  options.bearer_token.clear();
  std::unique_ptr<Client> anonymous = *Client::Create(server->target(), options);

  const std::vector<float> values(4 * 2 * 8, 0.25f);
  v1::ForwardRequest forward;
  *forward.mutable_q() = *MakeTensor(v1::DTYPE_FLOAT32, {4, 2, 8}, values);
  *forward.mutable_k() = *MakeTensor(v1::DTYPE_FLOAT32, {4, 2, 8}, values);
  *forward.mutable_v() = *MakeTensor(v1::DTYPE_FLOAT32, {4, 2, 8}, values);
  for (int32_t offset : {0, 4}) {
    forward.add_cu_seqlens_q(offset);
    forward.add_cu_seqlens_k(offset);
  }
  forward.set_keep_context(true);
  absl::StatusOr<v1::ForwardResponse> answer = owner->Forward(forward);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_FALSE(answer->context_id().empty());
  v1::BackwardRequest by_context;
  *by_context.mutable_dout() = forward.q();
  by_context.set_context_id(answer->context_id());

  EXPECT_EQ(other->Backward(by_context).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other->ReleaseContext(answer->context_id()).value_or(true), false);
  EXPECT_EQ(anonymous->ReleaseContext(answer->context_id()).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(owner->Backward(by_context).ok());
}

}  // namespace
}  // namespace attnserve::testing
