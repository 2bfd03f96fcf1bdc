#include "server/engine/work_estimate.h"

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

RequestProfile Profile(double flops, double scores, int64_t bytes) {
  RequestProfile request;
  request.flops = flops;
  request.scores = scores;
  request.device_bytes = bytes;
  return request;
}

TEST(WorkEstimateTest, FamilyRatesFollowTheTable) {
  EXPECT_GT(FamilyThroughput("flash", 90, 1).flops, FamilyThroughput("fallback", 90, 1).flops);
  EXPECT_GT(FamilyThroughput("fallback", 90, 1).flops,
            FamilyThroughput("reference", 90, 1).flops);
  EXPECT_GT(FamilyThroughput("flash", 90, 1).flops, FamilyThroughput("flash", 75, 1).flops);
  // The reference runs on the host whichever queue it came through; an unknown family is
  // assumed as slow as the host.
  EXPECT_DOUBLE_EQ(FamilyThroughput("reference", 90, 4).flops,
                   FamilyThroughput("reference", 0, 4).flops);
  EXPECT_DOUBLE_EQ(FamilyThroughput("a family from the future", 90, 1).scores,
                   FamilyThroughput("reference", 0, 1).scores);
  EXPECT_TRUE(RunsOnGpu("flash", 90));
  EXPECT_FALSE(RunsOnGpu("reference", 90));
  EXPECT_FALSE(RunsOnGpu("flash", 0));
}

TEST(WorkEstimateTest, TheHostScalesWithItsThreads) {
  const Throughput one = FamilyThroughput("reference", 0, 1);
  const Throughput four = FamilyThroughput("reference", 0, 4);
  EXPECT_DOUBLE_EQ(four.flops, 4 * one.flops);
  EXPECT_DOUBLE_EQ(four.scores, 4 * one.scores);
  EXPECT_EQ(one.link_bytes, 0);
  // 0 (unresolved) counts as one thread, never as infinitely fast.
  EXPECT_DOUBLE_EQ(FamilyThroughput("reference", 0, 0).flops, one.flops);
}

TEST(WorkEstimateTest, ScoresDominateAtHeadDimOneOnTheHost) {
  // The request that held the 2-core CPU device ~19 s: one 32,768-token sequence at head_dim 1.
  const double scores = 32768.0 * 32768;
  const RequestProfile request = Profile(4 * scores, scores, 3 * 32768 * 4);
  const double seconds = EstimatedSeconds(request, "reference", 0, 2);
  EXPECT_NEAR(seconds, scores / 60e6 + 4 * scores / 16e9, 1e-9);
  EXPECT_GT(seconds, 15);  // FLOPs alone said a quarter of a second
  EXPECT_LT(seconds, 25);
}

TEST(WorkEstimateTest, GpuFamiliesPayForTheirTransfers) {
  const RequestProfile request = Profile(3e12, 4.3e9, int64_t{1} << 30);
  const Throughput flash = FamilyThroughput("flash", 90, 1);
  EXPECT_DOUBLE_EQ(EstimatedSeconds(request, "flash", 90, 1),
                   3e12 / flash.flops + 4.3e9 / flash.scores + (1 << 30) / flash.link_bytes);
  EXPECT_LT(EstimatedSeconds(request, "flash", 90, 1), 1);
}

}  // namespace
}  // namespace attnserve::engine
