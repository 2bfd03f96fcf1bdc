#include "tools/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace attnserve::load {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

TEST(LatencyHistogramTest, EmptyIsAllZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.Percentile(50), absl::ZeroDuration());
  const LatencySummary s = h.Summarize();
  EXPECT_EQ(s.p99, 0);
  EXPECT_EQ(s.max, 0);
}

TEST(LatencyHistogramTest, SmallValuesAreExactNearestRank) {
  LatencyHistogram h;
  for (int ns = 1000; ns >= 1; --ns) h.Record(absl::Nanoseconds(ns));
  EXPECT_EQ(h.count(), 1000);
  EXPECT_EQ(h.Percentile(50), absl::Nanoseconds(500));
  EXPECT_EQ(h.Percentile(90), absl::Nanoseconds(900));
  EXPECT_EQ(h.Percentile(99), absl::Nanoseconds(990));
  EXPECT_EQ(h.Percentile(99.9), absl::Nanoseconds(999));
  EXPECT_EQ(h.Percentile(100), absl::Nanoseconds(1000));
  EXPECT_EQ(h.Percentile(0), absl::Nanoseconds(1));
  EXPECT_EQ(h.min(), absl::Nanoseconds(1));
  EXPECT_EQ(h.max(), absl::Nanoseconds(1000));
  EXPECT_EQ(h.mean(), absl::Nanoseconds(500.5));
}

TEST(LatencyHistogramTest, MillisecondPercentilesWithinPrecision) {
  LatencyHistogram h;
  for (int ms = 1; ms <= 100; ++ms) h.Record(absl::Milliseconds(ms));
  const LatencySummary s = h.Summarize();
  EXPECT_NEAR(s.p50, 50, 50 * 0.002);
  EXPECT_NEAR(s.p90, 90, 90 * 0.002);
  EXPECT_NEAR(s.p95, 95, 95 * 0.002);
  EXPECT_NEAR(s.p99, 99, 99 * 0.002);
  EXPECT_DOUBLE_EQ(s.p999, 100);  // clamped to the exact max
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_NEAR(s.mean, 50.5, 1e-9);
}

TEST(LatencyHistogramTest, MatchesSortedSamplesOnRandomData) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> latency_us(6.0, 1.0);
  LatencyHistogram h;
  std::vector<int64_t> samples;
  for (int i = 0; i < 20000; ++i) {
    const int64_t ns = static_cast<int64_t>(latency_us(rng) * 1000);
    samples.push_back(ns);
    h.Record(absl::Nanoseconds(ns));
  }
  std::sort(samples.begin(), samples.end());
  double previous = 0;
  for (double p : {1.0, 10.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0}) {
    // Nearest rank, with the same guard against 99.9 / 100 * n landing just above an integer.
    const size_t rank = static_cast<size_t>(std::ceil(p / 100 * samples.size() - 1e-9));
    const double want = static_cast<double>(samples[std::max<size_t>(rank, 1) - 1]);
    const double got = absl::ToDoubleNanoseconds(h.Percentile(p));
    EXPECT_NEAR(got, want, want * 0.002) << "p" << p;
    EXPECT_GE(got, previous) << "percentiles must not decrease";
    previous = got;
  }
}

TEST(LatencyHistogramTest, MergeEqualsRecordingEverything) {
  LatencyHistogram a, b, all;
  for (int i = 1; i <= 500; ++i) {
    (i % 3 == 0 ? a : b).Record(absl::Microseconds(i * 7));
    all.Record(absl::Microseconds(i * 7));
  }
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.min(), all.min());
  EXPECT_EQ(a.max(), all.max());
  for (double p : {50.0, 99.0, 99.9}) EXPECT_EQ(a.Percentile(p), all.Percentile(p));
  LatencyHistogram empty;
  empty.Merge(all);
  EXPECT_EQ(empty.min(), all.min());
}

TEST(LatencyHistogramTest, OutOfRangeValuesAreClamped) {
  LatencyHistogram h;
  h.Record(-absl::Seconds(1));
  h.Record(absl::Hours(10));
  EXPECT_EQ(h.min(), absl::ZeroDuration());
  EXPECT_GT(h.max(), absl::Minutes(17));
  EXPECT_LE(h.Percentile(100), h.max());
  EXPECT_EQ(h.Percentile(50), absl::ZeroDuration());
}

TEST(LatencyHistogramTest, SingleSampleIsEveryPercentile) {
  LatencyHistogram h;
  h.Record(absl::Microseconds(1234));
  EXPECT_DOUBLE_EQ(Ms(h.Percentile(1)), 1.234);
  EXPECT_DOUBLE_EQ(Ms(h.Percentile(99.9)), 1.234);
}

}  // namespace
}  // namespace attnserve::load
