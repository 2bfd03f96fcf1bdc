// A test suite whose tests share one server with default flags (started once for the suite,
// stopped with SIGTERM after it, which must exit 0) and get a fresh client each.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "server_process.h"

namespace attnserve::testing {

class SharedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = ServerProcess::Start().release(); }
  static void TearDownTestSuite() {
    if (server_ != nullptr) EXPECT_EQ(server_->Terminate(), 0) << server_->Log();
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    client_ = server_->NewClient();
  }

  static inline ServerProcess* server_ = nullptr;
  std::unique_ptr<Client> client_;
};

}  // namespace attnserve::testing
