#include "server/engine/priority.h"

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

TEST(PriorityTest, ParsesTheThreeLevelsAndNamesTheKeyOtherwise) {
  EXPECT_EQ(*ParsePriority("high"), Priority::kHigh);
  EXPECT_EQ(*ParsePriority(" Normal "), Priority::kNormal);
  EXPECT_EQ(*ParsePriority("LOW"), Priority::kLow);
  absl::StatusOr<Priority> bad = ParsePriority("urgent");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("x-attnserve-priority"), absl::string_view::npos);
  EXPECT_NE(bad.status().message().find("urgent"), absl::string_view::npos);
}

TEST(PriorityTest, WaitingAgesAJobUpOneLevelPerInterval) {
  const absl::Duration aging = absl::Milliseconds(100);
  EXPECT_EQ(EffectiveLevel(Priority::kLow, absl::Milliseconds(99), aging), 2);
  EXPECT_EQ(EffectiveLevel(Priority::kLow, absl::Milliseconds(100), aging), 1);
  EXPECT_EQ(EffectiveLevel(Priority::kLow, absl::Milliseconds(250), aging), 0);
  EXPECT_EQ(EffectiveLevel(Priority::kLow, absl::Seconds(10), aging), 0);
  EXPECT_EQ(EffectiveLevel(Priority::kNormal, absl::ZeroDuration(), aging), 1);
  EXPECT_EQ(EffectiveLevel(Priority::kHigh, absl::Seconds(1), aging), 0);
}

}  // namespace
}  // namespace attnserve::engine
