// Metrics of the bulk data path (transport/data), registered beside ServerMetrics' in its
// registry so /metrics shows both. Thread-safe like ServerMetrics.
#pragma once

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attnserve::metrics {

class DataMetrics {
 public:
  explicit DataMetrics(prometheus::Registry& registry);

  // One call per CHUNK frame's payload, received or sent.
  void AddReceivedChunk(double bytes);
  void AddSentChunk(double bytes);
  void AddSessions(double delta);
  void AddConnections(double delta);
  void AddBufferedBytes(double delta);
  // The --data_max_buffered_bytes budget, so alerts can compare buffered bytes against it.
  void SetBufferedBytesLimit(double bytes);
  // One finished Forward or Backward call of the data channel (answered or refused), by gRPC
  // status code name; attnserve_requests_total counts it too, under the same rpc, so the
  // difference is the native API's calls over gRPC.
  void RecordRequest(const std::string& rpc, const std::string& code);
  // reason: a short label such as "bad_magic", "duplicate_chunk", "hello_timeout".
  void RecordProtocolError(const std::string& reason);
  // From a request's REQUEST frame to its last payload byte ("in"), from its RESPONSE being
  // queued to its last byte sent ("out").
  void RecordTransfer(const std::string& direction, double seconds);
  // One answered data channel call: `engine` seconds from its hand-over to the engine to its
  // answer, of which `overlap` ran while its payload still arrived or its first groups' out
  // rows were already going back (a grouped forward); the rest waited for bytes or none.
  void RecordOverlap(double overlap, double engine);

 private:
  prometheus::Counter& received_bytes_;
  prometheus::Counter& sent_bytes_;
  prometheus::Family<prometheus::Counter>& chunks_;
  prometheus::Counter& chunks_in_;
  prometheus::Counter& chunks_out_;
  prometheus::Gauge& sessions_;
  prometheus::Gauge& connections_;
  prometheus::Gauge& buffered_bytes_;
  prometheus::Gauge& buffered_bytes_limit_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& protocol_errors_;
  prometheus::Family<prometheus::Histogram>& transfer_seconds_;
  prometheus::Histogram& overlap_seconds_;
  prometheus::Counter& engine_seconds_;
};

}  // namespace attnserve::metrics
