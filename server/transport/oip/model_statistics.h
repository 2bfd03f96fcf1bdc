// Per-model counts and cumulative durations for the protocol's statistics extension
// (ModelStatistics, GET /v2/models/<m>/stats), as Triton reports them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace attnserve::transport::oip {

struct Duration {
  uint64_t count = 0;
  uint64_t ns = 0;
};

struct ModelCounts {
  uint64_t last_inference_ms = 0;  // since the epoch; 0: never
  uint64_t inference_count = 0;
  uint64_t execution_count = 0;
  Duration success, fail, queue, compute_infer;
};

class ModelStatistics {
 public:
  void RecordSuccess(const std::string& model, uint64_t total_ns, uint64_t queue_ns,
                     uint64_t compute_ns);
  void RecordFailure(const std::string& model, uint64_t total_ns);
  ModelCounts Get(const std::string& model) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, ModelCounts> counts_;
};

}  // namespace attnserve::transport::oip
