#include "server/metrics/protocol_metrics.h"

namespace attnserve::metrics {

ProtocolMetrics::ProtocolMetrics(prometheus::Registry& registry)
    : inferences_(prometheus::BuildCounter()
                      .Name("attnserve_inference_protocol_requests_total")
                      .Help("Open Inference Protocol inference calls, by protocol (grpc, http), "
                            "model, shared-memory use (none, system, cuda) and status code.")
                      .Register(registry)),
      shared_memory_bytes_(prometheus::BuildCounter()
                               .Name("attnserve_shared_memory_bytes_total")
                               .Help("Tensor bytes read from (in) or written to (out) "
                                     "registered shared-memory regions, by kind.")
                               .Register(registry)) {}

void ProtocolMetrics::RecordInference(const std::string& protocol, const std::string& model,
                                      const std::string& shared_memory,
                                      const std::string& code) {
  inferences_
      .Add({{"protocol", protocol},
            {"model", model},
            {"shared_memory", shared_memory},
            {"code", code}})
      .Increment();
}

void ProtocolMetrics::AddSharedMemoryBytes(const std::string& kind,
                                           const std::string& direction, double bytes) {
  shared_memory_bytes_.Add({{"kind", kind}, {"direction", direction}}).Increment(bytes);
}

}  // namespace attnserve::metrics
