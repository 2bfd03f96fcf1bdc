#include "server/engine/sequence_groups.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

TEST(SequenceGroupsTest, WaitReturnsOnceItsGroupArrivedInAnyOrder) {
  std::vector<int> finished;
  SequenceGroups groups({2, 5, 6}, absl::InfiniteFuture(), nullptr,
                        [&](int g) { finished.push_back(g); });
  EXPECT_EQ(groups.count(), 3);
  EXPECT_EQ(groups.first_sequence(1), 2);
  EXPECT_EQ(groups.end_sequence(1), 5);
  std::atomic<int> passed{-1};
  std::thread worker([&] {
    for (int g = 0; g < groups.count(); ++g) {
      ASSERT_TRUE(groups.WaitFor(g).ok());
      passed = g;
      groups.Finished(g);
    }
  });
  groups.MarkArrived(2);  // later groups first: the worker still waits for group 0
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(passed.load(), -1);
  groups.MarkArrived(0);
  while (passed.load() < 0) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(passed.load(), 0);  // group 1 is still missing
  groups.MarkArrived(1);
  worker.join();
  EXPECT_EQ(finished, (std::vector<int>{0, 1, 2}));
}

TEST(SequenceGroupsTest, CancellationEndsAWait) {
  std::atomic<bool> cancelled{false};
  SequenceGroups groups({1, 2}, absl::InfiniteFuture(), [&] { return cancelled.load(); },
                        [](int) {});
  groups.MarkArrived(0);
  EXPECT_TRUE(groups.WaitFor(0).ok());
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(30));
    cancelled = true;
  });
  EXPECT_EQ(groups.WaitForAll().code(), absl::StatusCode::kCancelled);
  canceller.join();
}

TEST(SequenceGroupsTest, DeadlineEndsAWait) {
  SequenceGroups groups({1}, absl::Now() + absl::Milliseconds(30), nullptr, [](int) {});
  EXPECT_EQ(groups.WaitFor(0).code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace attnserve::engine
