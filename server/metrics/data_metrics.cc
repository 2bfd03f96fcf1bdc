#include "server/metrics/data_metrics.h"

namespace attnserve::metrics {
namespace {

// 100 us (a small inline request) to ~100 s (a gigabyte over a slow link).
prometheus::Histogram::BucketBoundaries TransferBuckets() {
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
          0.25, 0.5,    1.0,  2.5,  5.0,    10.0, 25.0, 50.0,   100.0};
}

}  // namespace

DataMetrics::DataMetrics(prometheus::Registry& registry)
    : received_bytes_(prometheus::BuildCounter()
                          .Name("attnserve_data_received_bytes_total")
                          .Help("Tensor bytes received in CHUNK frames on the data channel.")
                          .Register(registry)
                          .Add({})),
      sent_bytes_(prometheus::BuildCounter()
                      .Name("attnserve_data_sent_bytes_total")
                      .Help("Tensor bytes sent in CHUNK frames on the data channel.")
                      .Register(registry)
                      .Add({})),
      chunks_(prometheus::BuildCounter()
                  .Name("attnserve_data_chunks_total")
                  .Help("CHUNK frames on the data channel by direction.")
                  .Register(registry)),
      chunks_in_(chunks_.Add({{"direction", "in"}})),
      chunks_out_(chunks_.Add({{"direction", "out"}})),
      sessions_(prometheus::BuildGauge()
                    .Name("attnserve_data_sessions")
                    .Help("Data channel sessions with at least one open connection.")
                    .Register(registry)
                    .Add({})),
      connections_(prometheus::BuildGauge()
                       .Name("attnserve_data_connections")
                       .Help("Open data channel connections.")
                       .Register(registry)
                       .Add({})),
      buffered_bytes_(prometheus::BuildGauge()
                          .Name("attnserve_data_buffered_bytes")
                          .Help("Receive buffer bytes held by data channel requests.")
                          .Register(registry)
                          .Add({})),
      buffered_bytes_limit_(prometheus::BuildGauge()
                                .Name("attnserve_data_buffered_bytes_limit")
                                .Help("Receive buffer bytes data channel requests may hold at "
                                      "once (--data_max_buffered_bytes).")
                                .Register(registry)
                                .Add({})),
      requests_(prometheus::BuildCounter()
                    .Name("attnserve_data_requests_total")
                    .Help("Forward and Backward calls over the data channel by method and "
                          "status code (attnserve_requests_total counts them too).")
                    .Register(registry)),
      protocol_errors_(prometheus::BuildCounter()
                           .Name("attnserve_data_protocol_errors_total")
                           .Help("Data channel connections closed for breaking the protocol.")
                           .Register(registry)),
      transfer_seconds_(prometheus::BuildHistogram()
                            .Name("attnserve_data_transfer_seconds")
                            .Help("Time to move one request's payload in or its response out.")
                            .Register(registry)),
      overlap_seconds_(prometheus::BuildHistogram()
                           .Name("attnserve_data_overlap_seconds")
                           .Help("Per data channel call, seconds the engine had it while its "
                                 "payload still arrived or its answer was already being sent.")
                           .Register(registry)
                           .Add({}, TransferBuckets())),
      engine_seconds_(prometheus::BuildCounter()
                          .Name("attnserve_data_engine_seconds_total")
                          .Help("Seconds data channel calls spent with the engine (hand-over "
                                "to answer): the denominator of the overlap ratio.")
                          .Register(registry)
                          .Add({})) {}

void DataMetrics::AddReceivedChunk(double bytes) {
  received_bytes_.Increment(bytes);
  chunks_in_.Increment();
}

void DataMetrics::AddSentChunk(double bytes) {
  sent_bytes_.Increment(bytes);
  chunks_out_.Increment();
}

void DataMetrics::AddSessions(double delta) { sessions_.Increment(delta); }
void DataMetrics::AddConnections(double delta) { connections_.Increment(delta); }
void DataMetrics::AddBufferedBytes(double delta) { buffered_bytes_.Increment(delta); }
void DataMetrics::SetBufferedBytesLimit(double bytes) { buffered_bytes_limit_.Set(bytes); }

void DataMetrics::RecordRequest(const std::string& rpc, const std::string& code) {
  requests_.Add({{"rpc", rpc}, {"code", code}}).Increment();
}

void DataMetrics::RecordProtocolError(const std::string& reason) {
  protocol_errors_.Add({{"reason", reason}}).Increment();
}

void DataMetrics::RecordOverlap(double overlap, double engine) {
  overlap_seconds_.Observe(overlap);
  engine_seconds_.Increment(engine);
}

void DataMetrics::RecordTransfer(const std::string& direction, double seconds) {
  transfer_seconds_.Add({{"direction", direction}}, TransferBuckets()).Observe(seconds);
}

}  // namespace attnserve::metrics
