// Inference calls of the Open Inference Protocol frontends (transport/oip), by protocol
// ("grpc" or "http"), model, shared-memory use ("none", "system" or "cuda") and status code,
// and the bytes passed through shared memory instead of the wire; registered on the server's
// registry beside ServerMetrics' own. Thread-safe as prometheus-cpp's families are.
#pragma once

#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace attnserve::metrics {

class ProtocolMetrics {
 public:
  explicit ProtocolMetrics(prometheus::Registry& registry);

  void RecordInference(const std::string& protocol, const std::string& model,
                       const std::string& shared_memory, const std::string& code);
  // direction: "in" (inputs read from a region) or "out" (outputs written to one).
  void AddSharedMemoryBytes(const std::string& kind, const std::string& direction,
                            double bytes);

 private:
  prometheus::Family<prometheus::Counter>& inferences_;
  prometheus::Family<prometheus::Counter>& shared_memory_bytes_;
};

}  // namespace attnserve::metrics
