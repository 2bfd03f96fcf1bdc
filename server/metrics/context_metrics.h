// The saved-context metrics (engine/context_store.h), registered on the server's registry
// beside ServerMetrics' own. Thread-safe as prometheus-cpp's families are.
#pragma once

#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace attnserve::metrics {

class ContextMetrics {
 public:
  explicit ContextMetrics(prometheus::Registry& registry);

  // What a device holds now.
  void SetHeld(const std::string& device, double contexts, double bytes);
  void RecordLookup(bool hit);
  // reason: "ttl" (unused for the TTL) or "lru" (room for a newer context).
  void RecordEviction(const std::string& device, const std::string& reason);
  // Released by ReleaseContext or by the Backward that used it.
  void RecordRelease();

 private:
  prometheus::Family<prometheus::Gauge>& contexts_;
  prometheus::Family<prometheus::Gauge>& bytes_;
  prometheus::Family<prometheus::Counter>& lookups_;
  prometheus::Family<prometheus::Counter>& evictions_;
  prometheus::Counter& releases_;
};

}  // namespace attnserve::metrics
