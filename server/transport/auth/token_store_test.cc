#include "server/transport/auth/token_store.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseTokensTest, OneTokenPerLineSkippingCommentsAndBlankLines) {
  absl::StatusOr<std::vector<std::string>> tokens = ParseTokens(
      "# training hosts\n"
      "alpha-123\n"
      "\n"
      "   beta.456  \r\n"
      "  # rotated 2026-11-01\n"
      "\tgamma/789=\n");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_THAT(*tokens, ElementsAre("alpha-123", "beta.456", "gamma/789="));
}

TEST(ParseTokensTest, EmptyAndCommentOnlyTextsHoldNoToken) {
  EXPECT_THAT(*ParseTokens(""), ElementsAre());
  EXPECT_THAT(*ParseTokens("# nothing yet\n\n"), ElementsAre());
}

TEST(ParseTokensTest, RefusesSpacesAndControlCharactersNamingTheLineButNotTheText) {
  absl::StatusOr<std::vector<std::string>> tokens = ParseTokens("good\nsecret with-space\n");
  ASSERT_FALSE(tokens.ok());
  EXPECT_THAT(tokens.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(tokens.status().message(), Not(HasSubstr("secret")));
  EXPECT_FALSE(ParseTokens("bad\x01token\n").ok());
  EXPECT_FALSE(ParseTokens("caf\xc3\xa9\n").ok());
}

TEST(TokenStoreTest, ContainsExactlyTheTokensOfTheLastReplace) {
  TokenStore store;
  EXPECT_FALSE(store.Contains("alpha"));
  store.Replace({"alpha", "beta"});
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.Contains("alpha"));
  EXPECT_TRUE(store.Contains("beta"));
  EXPECT_FALSE(store.Contains("alph"));
  EXPECT_FALSE(store.Contains("alphaa"));
  EXPECT_FALSE(store.Contains("ALPHA"));
  EXPECT_FALSE(store.Contains(""));
  store.Replace({"beta"});
  EXPECT_FALSE(store.Contains("alpha"));
  EXPECT_TRUE(store.Contains("beta"));
  store.Replace({});
  EXPECT_FALSE(store.Contains("beta"));
}

}  // namespace
}  // namespace attnserve::transport
