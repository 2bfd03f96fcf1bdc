#include "server/transport/data/chunk_tracker.h"

#include "gtest/gtest.h"
#include "server/transport/data/frame.h"

namespace attnserve::transport::data {
namespace {

TEST(ChunkTrackerTest, AcceptsEachChunkOnceInAnyOrder) {
  ChunkTracker tracker(250, 100);  // chunks [0,100) [100,200) [200,250)
  ASSERT_TRUE(tracker.Claim(200, 50).ok());
  ASSERT_TRUE(tracker.Claim(0, 100).ok());
  ASSERT_TRUE(tracker.Claim(100, 100).ok());
  EXPECT_FALSE(tracker.Arrived(50));
  EXPECT_FALSE(tracker.Arrived(100));
  EXPECT_TRUE(tracker.Arrived(100));
  EXPECT_TRUE(tracker.complete());
}

TEST(ChunkTrackerTest, RefusesWhatTheDivisionDoesNotAllow) {
  ChunkTracker tracker(250, 100);
  ASSERT_TRUE(tracker.Claim(0, 100).ok());
  EXPECT_EQ(ViolationReason(tracker.Claim(0, 100)), "duplicate_chunk");
  EXPECT_EQ(ViolationReason(tracker.Claim(250, 1)), "chunk_out_of_range");
  EXPECT_EQ(ViolationReason(tracker.Claim(uint64_t{1} << 63, 1)), "chunk_out_of_range");
  EXPECT_EQ(ViolationReason(tracker.Claim(150, 100)), "chunk_out_of_range");
  EXPECT_EQ(ViolationReason(tracker.Claim(100, 99)), "chunk_length");
  EXPECT_EQ(ViolationReason(tracker.Claim(200, 100)), "chunk_length");
  EXPECT_FALSE(tracker.complete());
}

TEST(ChunkTrackerTest, AnEmptyPayloadIsCompleteAtOnce) {
  ChunkTracker tracker(0, 100);
  EXPECT_TRUE(tracker.complete());
  EXPECT_EQ(ViolationReason(tracker.Claim(0, 1)), "chunk_out_of_range");
}

}  // namespace
}  // namespace attnserve::transport::data
