// Latency statistics for attnload: an HdrHistogram-style log-linear histogram, so recording
// is O(1) and memory fixed at any request rate, with percentiles to 0.2% relative precision.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace attnserve::load {

struct LatencySummary {  // milliseconds
  double min = 0, mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, p999 = 0, max = 0;
};

class LatencyHistogram {
 public:
  LatencyHistogram();

  // Negative latencies count as 0; those beyond ~18 minutes as ~18 minutes.
  void Record(absl::Duration latency);
  void Merge(const LatencyHistogram& other);

  int64_t count() const { return count_; }
  absl::Duration min() const;
  absl::Duration max() const;
  absl::Duration mean() const;
  // Nearest rank: the smallest recorded value v with at least `percentile`% of the samples
  // <= v (to the bucket's precision, never outside [min, max]); 0 when empty.
  absl::Duration Percentile(double percentile) const;
  LatencySummary Summarize() const;

 private:
  static int BucketIndex(int64_t nanos);
  // The value a bucket stands for: its midpoint (exact for the unit-wide buckets).
  static int64_t BucketValue(int index);

  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t min_ns_ = 0, max_ns_ = 0;
  double sum_ns_ = 0;
};

}  // namespace attnserve::load
