#include "server/transport/auth/token_file_reloader.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kPoll = absl::Milliseconds(20);

class TokenFileReloaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/tokens_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // Writes through a rename, as editors and Kubernetes do, so each version is a new inode.
  void Write(const std::string& text) {
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp, std::ios::binary) << text;
    ASSERT_EQ(std::rename(tmp.c_str(), path_.c_str()), 0);
  }

  // Polls until `token`'s presence in the store is `want`, for at most two seconds.
  bool WaitFor(const std::string& token, bool want) {
    for (int i = 0; i < 200; ++i) {
      if (store_.Contains(token) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::string path_;
  TokenStore store_;
};

TEST_F(TokenFileReloaderTest, StartLoadsTheFile) {
  Write("# hosts\nalpha\nbeta\n");
  auto reloader = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  EXPECT_TRUE(store_.Contains("alpha"));
  EXPECT_TRUE(store_.Contains("beta"));
}

TEST_F(TokenFileReloaderTest, StartFailsOnAMissingMalformedOrEmptyFile) {
  auto missing = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(path_));
  Write("two words\n");
  auto malformed = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_FALSE(malformed.ok());
  EXPECT_THAT(malformed.status().message(), HasSubstr("line 1"));
  Write("# only a comment\n");
  auto empty = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("no token"));
}

TEST_F(TokenFileReloaderTest, AChangedFileIsReloadedByThePoller) {
  Write("alpha\nbeta\n");
  auto reloader = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  Write("beta\ngamma\n");
  EXPECT_TRUE(WaitFor("alpha", false)) << "a revoked token is still accepted";
  EXPECT_TRUE(store_.Contains("beta"));
  EXPECT_TRUE(store_.Contains("gamma"));
}

TEST_F(TokenFileReloaderTest, ABadOrDeletedFileRevokesEveryToken) {
  Write("alpha\n");
  auto reloader = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  Write("alpha\nnot a token\n");
  EXPECT_FALSE((*reloader)->Reload().ok());
  EXPECT_FALSE(store_.Contains("alpha")) << "a malformed file left the old tokens in force";
  Write("alpha\n");
  EXPECT_TRUE(WaitFor("alpha", true));
  std::remove(path_.c_str());
  EXPECT_TRUE(WaitFor("alpha", false)) << "a deleted file left the old tokens in force";
  EXPECT_FALSE((*reloader)->Reload().ok());
  EXPECT_EQ(store_.size(), 0u);
  // Fixed again: the poller picks it up.
  Write("delta\n");
  EXPECT_TRUE(WaitFor("delta", true));
  EXPECT_FALSE(store_.Contains("alpha"));
}

TEST_F(TokenFileReloaderTest, AByteOrderMarkIsNoPartOfTheFirstToken) {
  Write("\xEF\xBB\xBF" "alpha\nbeta\n");
  auto reloader = TokenFileReloader::Start(path_, &store_, kPoll);
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  EXPECT_TRUE(store_.Contains("alpha"));
  // Rewritten with a mark, revoking alpha: the rewrite takes effect.
  Write("\xEF\xBB\xBF" "beta\n");
  EXPECT_TRUE(WaitFor("alpha", false));
  EXPECT_TRUE(store_.Contains("beta"));
}

TEST_F(TokenFileReloaderTest, AnExplicitReloadTakesEffectAtOnceAndAnEmptyFileRevokesAll) {
  Write("alpha\n");
  auto reloader = TokenFileReloader::Start(path_, &store_, absl::Hours(1));
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  Write("");
  ASSERT_TRUE((*reloader)->Reload().ok());
  EXPECT_FALSE(store_.Contains("alpha"));
  EXPECT_EQ(store_.size(), 0u);
}

}  // namespace
}  // namespace attnserve::transport
