#include "server/metrics/context_metrics.h"

namespace attnserve::metrics {

ContextMetrics::ContextMetrics(prometheus::Registry& registry)
    : contexts_(prometheus::BuildGauge()
                    .Name("attnserve_contexts")
                    .Help("Saved contexts (keep_context forwards) a device holds.")
                    .Register(registry)),
      bytes_(prometheus::BuildGauge()
                 .Name("attnserve_context_bytes")
                 .Help("Bytes of saved contexts a device holds (part of its memory budget).")
                 .Register(registry)),
      lookups_(prometheus::BuildCounter()
                   .Name("attnserve_context_lookups_total")
                   .Help("Backwards by context_id: found (hit) or not (miss: unknown, expired "
                         "or evicted; the client resends in full).")
                   .Register(registry)),
      evictions_(prometheus::BuildCounter()
                     .Name("attnserve_context_evictions_total")
                     .Help("Contexts dropped unused: after the TTL (ttl) or to make room for a "
                           "newer one (lru).")
                     .Register(registry)),
      releases_(prometheus::BuildCounter()
                    .Name("attnserve_context_releases_total")
                    .Help("Contexts released by ReleaseContext or by their Backward.")
                    .Register(registry)
                    .Add({})) {}

void ContextMetrics::SetHeld(const std::string& device, double contexts, double bytes) {
  contexts_.Add({{"device", device}}).Set(contexts);
  bytes_.Add({{"device", device}}).Set(bytes);
}

void ContextMetrics::RecordLookup(bool hit) {
  lookups_.Add({{"result", hit ? "hit" : "miss"}}).Increment();
}

void ContextMetrics::RecordEviction(const std::string& device, const std::string& reason) {
  evictions_.Add({{"device", device}, {"reason", reason}}).Increment();
}

void ContextMetrics::RecordRelease() { releases_.Increment(); }

}  // namespace attnserve::metrics
