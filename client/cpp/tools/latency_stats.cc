#include "tools/latency_stats.h"

#include <algorithm>
#include <cmath>

namespace attnserve::load {
namespace {

// Values below 2^kSubBucketBits ns are counted exactly; above, every power of two is split
// into kHalf sub-buckets, bounding the relative error by 1/kHalf.
constexpr int kSubBucketBits = 10;
constexpr int64_t kSubBuckets = int64_t{1} << kSubBucketBits;
constexpr int64_t kHalf = kSubBuckets / 2;
// 2^40 ns is about 18 minutes, far beyond any deadline a load test uses.
constexpr int kMaxBits = 40;
constexpr int64_t kMaxNanos = (int64_t{1} << kMaxBits) - 1;
constexpr int kBucketCount = kSubBuckets + (kMaxBits - kSubBucketBits) * kHalf;

int HighestBit(int64_t v) { return 63 - __builtin_clzll(static_cast<uint64_t>(v)); }

}  // namespace

LatencyHistogram::LatencyHistogram() : counts_(kBucketCount, 0) {}

int LatencyHistogram::BucketIndex(int64_t nanos) {
  if (nanos < kSubBuckets) return static_cast<int>(nanos);
  const int shift = HighestBit(nanos) - (kSubBucketBits - 1);
  const int64_t sub = nanos >> shift;  // in [kHalf, kSubBuckets)
  return static_cast<int>(kSubBuckets + (shift - 1) * kHalf + (sub - kHalf));
}

int64_t LatencyHistogram::BucketValue(int index) {
  if (index < kSubBuckets) return index;
  const int shift = 1 + static_cast<int>((index - kSubBuckets) / kHalf);
  const int64_t sub = kHalf + (index - kSubBuckets) % kHalf;
  const int64_t low = sub << shift;
  return low + ((int64_t{1} << shift) - 1) / 2;
}

void LatencyHistogram::Record(absl::Duration latency) {
  const int64_t nanos = std::clamp<int64_t>(absl::ToInt64Nanoseconds(latency), 0, kMaxNanos);
  ++counts_[BucketIndex(nanos)];
  min_ns_ = count_ == 0 ? nanos : std::min(min_ns_, nanos);
  max_ns_ = count_ == 0 ? nanos : std::max(max_ns_, nanos);
  sum_ns_ += static_cast<double>(nanos);
  ++count_;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  for (int i = 0; i < kBucketCount; ++i) counts_[i] += other.counts_[i];
  min_ns_ = count_ == 0 ? other.min_ns_ : std::min(min_ns_, other.min_ns_);
  max_ns_ = count_ == 0 ? other.max_ns_ : std::max(max_ns_, other.max_ns_);
  sum_ns_ += other.sum_ns_;
  count_ += other.count_;
}

absl::Duration LatencyHistogram::min() const { return absl::Nanoseconds(min_ns_); }
absl::Duration LatencyHistogram::max() const { return absl::Nanoseconds(max_ns_); }
absl::Duration LatencyHistogram::mean() const {
  return count_ == 0 ? absl::ZeroDuration() : absl::Nanoseconds(sum_ns_ / count_);
}

absl::Duration LatencyHistogram::Percentile(double percentile) const {
  if (count_ == 0) return absl::ZeroDuration();
  const double p = std::clamp(percentile, 0.0, 100.0);
  // The small epsilon keeps exact products such as 0.99 * 100 from rounding up a rank.
  const int64_t rank =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(p / 100.0 * count_ - 1e-9)));
  if (rank >= count_) return max();
  int64_t seen = 0;
  for (int i = 0; i < kBucketCount; ++i) {
    seen += counts_[i];
    if (seen >= rank) return absl::Nanoseconds(std::clamp(BucketValue(i), min_ns_, max_ns_));
  }
  return max();
}

LatencySummary LatencyHistogram::Summarize() const {
  auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
  LatencySummary s;
  s.min = ms(min());
  s.mean = ms(mean());
  s.p50 = ms(Percentile(50));
  s.p90 = ms(Percentile(90));
  s.p95 = ms(Percentile(95));
  s.p99 = ms(Percentile(99));
  s.p999 = ms(Percentile(99.9));
  s.max = ms(max());
  return s;
}

}  // namespace attnserve::load
