#include "server/metrics/child_cache.h"

#include <gtest/gtest.h>

namespace attnserve::metrics {
namespace {

TEST(ChildCacheTest, MakesEachChildOnceAndFindsItByItsLabelValues) {
  ChildCache<int> cache;
  int made = 0, a = 1, b = 2;
  auto make_a = [&]() -> int& {
    ++made;
    return a;
  };
  auto make_b = [&]() -> int& {
    ++made;
    return b;
  };
  EXPECT_EQ(&cache.Get({"cuda:0", "device"}, make_a), &a);
  EXPECT_EQ(&cache.Get({"cuda:0", "device"}, make_b), &a);
  // Values are kept apart: ("cuda:0d", "evice") is another child.
  EXPECT_EQ(&cache.Get({"cuda:0d", "evice"}, make_b), &b);
  EXPECT_EQ(made, 2);
}

}  // namespace
}  // namespace attnserve::metrics
