#include "server/transport/oip/model_statistics.h"

#include "absl/time/clock.h"

namespace attnserve::transport::oip {

void ModelStatistics::RecordSuccess(const std::string& model, uint64_t total_ns,
                                    uint64_t queue_ns, uint64_t compute_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  ModelCounts& c = counts_[model];
  c.last_inference_ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  ++c.inference_count;
  ++c.execution_count;
  c.success.count++;
  c.success.ns += total_ns;
  c.queue.count++;
  c.queue.ns += queue_ns;
  c.compute_infer.count++;
  c.compute_infer.ns += compute_ns;
}

void ModelStatistics::RecordFailure(const std::string& model, uint64_t total_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  ModelCounts& c = counts_[model];
  c.fail.count++;
  c.fail.ns += total_ns;
}

ModelCounts ModelStatistics::Get(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(model);
  return it == counts_.end() ? ModelCounts{} : it->second;
}

}  // namespace attnserve::transport::oip
