#include "server/transport/auth/authenticator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class AuthenticatorTest : public ::testing::Test {
 protected:
  AuthenticatorTest() : metrics_("test"), auth_(&tokens_, &metrics_) {
    tokens_.Replace({"s3cret-token"});
  }
  TokenStore tokens_;
  metrics::ServerMetrics metrics_;
  Authenticator auth_;
};

TEST_F(AuthenticatorTest, AcceptsAKnownBearerTokenWhateverTheSchemeCase) {
  EXPECT_TRUE(auth_.Check("Bearer s3cret-token").ok());
  EXPECT_TRUE(auth_.Check("bearer s3cret-token").ok());
  EXPECT_TRUE(auth_.Check("  BEARER   s3cret-token ").ok());
}

TEST_F(AuthenticatorTest, RefusesMissingMalformedAndUnknownCredentialsCountingEachReason) {
  const absl::Status missing = auth_.Check(std::nullopt);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("Bearer <token>"));
  EXPECT_EQ(auth_.Check("Basic czNjcmV0").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth_.Check("s3cret-token").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth_.Check("Bearer ").code(), absl::StatusCode::kUnauthenticated);  // no token
  const absl::Status wrong = auth_.Check("Bearer s3cret-tokem");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), Not(HasSubstr("s3cret")));
  const std::string text = metrics_.Serialize();
  EXPECT_THAT(text, HasSubstr("attnserve_auth_failures_total{reason=\"missing\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_auth_failures_total{reason=\"malformed\"} 3"));
  EXPECT_THAT(text, HasSubstr("attnserve_auth_failures_total{reason=\"invalid\"} 1"));
}

TEST(AuthenticatorOffTest, WithoutTokensEveryCallPasses) {
  metrics::ServerMetrics metrics("test");
  Authenticator auth(nullptr, &metrics);
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(auth.Check(std::nullopt).ok());
  EXPECT_TRUE(auth.Check("Bearer anything").ok());
}

}  // namespace
}  // namespace attnserve::transport
