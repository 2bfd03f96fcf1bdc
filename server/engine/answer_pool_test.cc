#include "server/engine/answer_pool.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

TEST(AnswerPoolTest, DestructionDeliversEveryPostedAnswerExactlyOnce) {
  std::atomic<int> delivered{0};
  std::atomic<int> moved_only_seen{0};
  {
    AnswerPool pool(3);
    for (int i = 0; i < 1000; ++i) {
      // Move-only captures, as a result tensor's would be.
      pool.Post([&delivered, &moved_only_seen, value = std::make_unique<int>(i)]() mutable {
        if (value != nullptr) ++moved_only_seen;
        ++delivered;
      });
    }
  }  // joins only after the queue is empty
  EXPECT_EQ(delivered.load(), 1000);
  EXPECT_EQ(moved_only_seen.load(), 1000);
}

TEST(AnswerPoolTest, OneSlowAnswerDoesNotHoldTheOthers) {
  // Declared before the pool, so they outlive its threads (the pool joins in its destructor).
  std::atomic<bool> release{false};
  std::atomic<int> fast_done{0};
  AnswerPool pool(2);
  pool.Post([&release] {
    while (!release.load()) std::this_thread::yield();
  });
  for (int i = 0; i < 10; ++i) pool.Post([&fast_done] { ++fast_done; });
  // Bounded: with the slow answer blocking every thread this would never finish.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fast_done.load() < 10 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  const int done_while_blocked = fast_done.load();
  release = true;
  EXPECT_EQ(done_while_blocked, 10);
}

}  // namespace
}  // namespace attnserve::engine
