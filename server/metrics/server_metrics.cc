#include "server/metrics/server_metrics.h"

#include <sstream>

#include "prometheus/text_serializer.h"

namespace attnserve::metrics {
namespace {

// Latency buckets from 100 us to ~100 s: attention requests span small CPU calls to long
// multi-megabyte GPU batches.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
      0.25, 0.5,    1.0,  2.5,  5.0,    10.0, 25.0, 50.0,   100.0};
  return buckets;
}

prometheus::Histogram::BucketBoundaries BatchBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128};
}

}  // namespace

ServerMetrics::ServerMetrics(const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_total_(prometheus::BuildCounter()
                          .Name("attnserve_requests_total")
                          .Help("Finished RPCs by method and gRPC status code.")
                          .Register(*registry_)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("attnserve_request_duration_seconds")
                            .Help("Time from receiving a request to sending its response.")
                            .Register(*registry_)),
      queue_duration_(prometheus::BuildHistogram()
                          .Name("attnserve_queue_duration_seconds")
                          .Help("Time a request waited in its device queue.")
                          .Register(*registry_)),
      compute_duration_(prometheus::BuildHistogram()
                            .Name("attnserve_compute_duration_seconds")
                            .Help("Time a request spent executing on its device.")
                            .Register(*registry_)),
      code_path_duration_(prometheus::BuildHistogram()
                              .Name("attnserve_code_path_compute_duration_seconds")
                              .Help("Time a request spent executing, by the kernel family and "
                                    "code path that ran it (e.g. flash/sm90).")
                              .Register(*registry_)),
      tokens_total_(prometheus::BuildCounter()
                        .Name("attnserve_tokens_total")
                        .Help("Query tokens processed.")
                        .Register(*registry_)),
      flops_total_(prometheus::BuildCounter()
                       .Name("attnserve_flops_total")
                       .Help("Attention FLOPs executed: 4*sum(sq*sk)*d*heads forward, halved "
                             "if causal, 2.5x that backward.")
                       .Register(*registry_)),
      received_bytes_(prometheus::BuildCounter()
                          .Name("attnserve_received_bytes_total")
                          .Help("Tensor bytes received in requests.")
                          .Register(*registry_)
                          .Add({})),
      sent_bytes_(prometheus::BuildCounter()
                      .Name("attnserve_sent_bytes_total")
                      .Help("Tensor bytes sent in responses.")
                      .Register(*registry_)
                      .Add({})),
      inflight_(prometheus::BuildGauge()
                    .Name("attnserve_inflight_requests")
                    .Help("Requests accepted and not yet answered.")
                    .Register(*registry_)
                    .Add({})),
      queue_depth_(prometheus::BuildGauge()
                       .Name("attnserve_queue_depth")
                       .Help("Requests waiting in a device queue.")
                       .Register(*registry_)),
      batch_requests_(prometheus::BuildHistogram()
                          .Name("attnserve_batch_requests")
                          .Help("Requests that shared one kernel launch (one observation per launch).")
                          .Register(*registry_)
                          .Add({}, BatchBuckets())),
      device_info_(prometheus::BuildGauge()
                       .Name("attnserve_device_info")
                       .Help("Devices this server computes on (value is always 1).")
                       .Register(*registry_)),
      device_memory_used_(prometheus::BuildGauge()
                              .Name("attnserve_device_memory_used_bytes")
                              .Help("Memory in use on a device.")
                              .Register(*registry_)),
      device_memory_total_(prometheus::BuildGauge()
                               .Name("attnserve_device_memory_total_bytes")
                               .Help("Memory a device has in all.")
                               .Register(*registry_)),
      rejections_total_(prometheus::BuildCounter()
                            .Name("attnserve_rejections_total")
                            .Help("Requests refused or dropped before running, by reason.")
                            .Register(*registry_)),
      auth_failures_total_(prometheus::BuildCounter()
                               .Name("attnserve_auth_failures_total")
                               .Help("Calls and HTTP requests refused for missing, malformed "
                                     "or invalid credentials, by reason.")
                               .Register(*registry_)),
      placements_total_(prometheus::BuildCounter()
                            .Name("attnserve_placements_total")
                            .Help("Requests placed on a device, by the kernel family routed "
                                  "there.")
                            .Register(*registry_)),
      queued_work_(prometheus::BuildGauge()
                       .Name("attnserve_device_queued_work_seconds")
                       .Help("Estimated seconds of work queued and running on a device (what "
                             "placement compares).")
                       .Register(*registry_)),
      memory_reserved_(prometheus::BuildGauge()
                           .Name("attnserve_device_memory_reserved_bytes")
                           .Help("Device memory reserved by running requests (estimated).")
                           .Register(*registry_)),
      memory_waits_total_(prometheus::BuildCounter()
                              .Name("attnserve_memory_waits_total")
                              .Help("Requests that waited in the queue for device memory.")
                              .Register(*registry_)),
      split_requests_total_(prometheus::BuildCounter()
                                .Name("attnserve_split_requests_total")
                                .Help("Requests too long for one launch "
                                      "(--max_launch_seconds), run as several.")
                                .Register(*registry_)),
      split_launches_total_(prometheus::BuildCounter()
                                .Name("attnserve_split_launches_total")
                                .Help("Launches the split requests ran as.")
                                .Register(*registry_)),
      priority_queue_duration_(prometheus::BuildHistogram()
                                   .Name("attnserve_priority_queue_duration_seconds")
                                   .Help("Time a request waited in its device queue, by "
                                         "priority level.")
                                   .Register(*registry_)),
      launch_phase_duration_(prometheus::BuildHistogram()
                                 .Name("attnserve_launch_phase_duration_seconds")
                                 .Help("Time of each phase of a launch: stage_in, device and "
                                       "stage_out on a GPU lane; answer (encoding, "
                                       "serializing and finishing the call) off the lane.")
                                 .Register(*registry_)),
      device_healthy_(prometheus::BuildGauge()
                          .Name("attnserve_device_healthy")
                          .Help("1 while a device serves requests; 0 after a device fault "
                                "(sticky CUDA error) until a reset of its context succeeds.")
                          .Register(*registry_)),
      device_faults_total_(prometheus::BuildCounter()
                               .Name("attnserve_device_faults_total")
                               .Help("Device faults that took a device out of service.")
                               .Register(*registry_)),
      device_resets_total_(prometheus::BuildCounter()
                               .Name("attnserve_device_resets_total")
                               .Help("Attempts to reset a faulted device, by result.")
                               .Register(*registry_)) {
  prometheus::BuildGauge()
      .Name("attnserve_build_info")
      .Help("Build of this server (value is always 1).")
      .Register(*registry_)
      .Add({{"version", version}})
      .Set(1);
}

void ServerMetrics::RecordRequest(const std::string& rpc, const std::string& code,
                                  double duration_seconds) {
  request_counts_.Get({rpc, code}, [&]() -> auto& {
    return requests_total_.Add({{"rpc", rpc}, {"code", code}});
  }).Increment();
  request_durations_.Get({rpc}, [&]() -> auto& {
    return request_duration_.Add({{"rpc", rpc}}, LatencyBuckets());
  }).Observe(duration_seconds);
}

void ServerMetrics::AddReceivedBytes(double bytes) { received_bytes_.Increment(bytes); }
void ServerMetrics::AddSentBytes(double bytes) { sent_bytes_.Increment(bytes); }
void ServerMetrics::AddInflight(double delta) { inflight_.Increment(delta); }

void ServerMetrics::RecordExecution(const std::string& rpc, const std::string& kernel,
                                    const std::string& device, double queue_seconds,
                                    double compute_seconds, double tokens, double flops) {
  queue_durations_.Get({rpc}, [&]() -> auto& {
    return queue_duration_.Add({{"rpc", rpc}}, LatencyBuckets());
  }).Observe(queue_seconds);
  compute_durations_.Get({rpc, kernel, device}, [&]() -> auto& {
    return compute_duration_.Add({{"rpc", rpc}, {"kernel", kernel}, {"device", device}},
                                 LatencyBuckets());
  }).Observe(compute_seconds);
  tokens_counts_.Get({rpc}, [&]() -> auto& {
    return tokens_total_.Add({{"rpc", rpc}});
  }).Increment(tokens);
  flops_counts_.Get({rpc, kernel, device}, [&]() -> auto& {
    return flops_total_.Add({{"rpc", rpc}, {"kernel", kernel}, {"device", device}});
  }).Increment(flops);
}

void ServerMetrics::RecordCodePath(const std::string& rpc, const std::string& code_path,
                                   const std::string& device, double compute_seconds) {
  code_path_durations_.Get({rpc, code_path, device}, [&]() -> auto& {
    return code_path_duration_.Add({{"rpc", rpc}, {"code_path", code_path}, {"device", device}},
                                   LatencyBuckets());
  }).Observe(compute_seconds);
}

void ServerMetrics::RecordBatch(int requests) { batch_requests_.Observe(requests); }

void ServerMetrics::RecordRejection(const std::string& reason) {
  rejections_total_.Add({{"reason", reason}}).Increment();
}

void ServerMetrics::RecordAuthFailure(const std::string& reason) {
  auth_failures_total_.Add({{"reason", reason}}).Increment();
}

void ServerMetrics::SetQueueDepth(const std::string& device, double depth) {
  queue_depths_.Get({device}, [&]() -> auto& {
    return queue_depth_.Add({{"device", device}});
  }).Set(depth);
}

void ServerMetrics::RecordPlacement(const std::string& device, const std::string& kernel) {
  placement_counts_.Get({device, kernel}, [&]() -> auto& {
    return placements_total_.Add({{"device", device}, {"kernel", kernel}});
  }).Increment();
}

void ServerMetrics::SetDeviceLoad(const std::string& device, double queued_seconds,
                                  double reserved_bytes) {
  queued_work_gauges_.Get({device}, [&]() -> auto& {
    return queued_work_.Add({{"device", device}});
  }).Set(queued_seconds);
  memory_reserved_gauges_.Get({device}, [&]() -> auto& {
    return memory_reserved_.Add({{"device", device}});
  }).Set(reserved_bytes);
}

void ServerMetrics::RecordMemoryWait(const std::string& device) {
  memory_waits_total_.Add({{"device", device}}).Increment();
}

void ServerMetrics::RecordSplitLaunches(const std::string& device, size_t launches) {
  split_requests_total_.Add({{"device", device}}).Increment();
  split_launches_total_.Add({{"device", device}}).Increment(static_cast<double>(launches));
}

void ServerMetrics::RecordPriorityQueueDuration(const std::string& priority, double seconds) {
  priority_queue_durations_.Get({priority}, [&]() -> auto& {
    return priority_queue_duration_.Add({{"priority", priority}}, LatencyBuckets());
  }).Observe(seconds);
}

void ServerMetrics::RecordLaunchPhase(const std::string& device, const std::string& phase,
                                      double seconds) {
  launch_phase_durations_.Get({device, phase}, [&]() -> auto& {
    return launch_phase_duration_.Add({{"device", device}, {"phase", phase}}, LatencyBuckets());
  }).Observe(seconds);
}

void ServerMetrics::SetDeviceHealthy(const std::string& device, bool healthy) {
  device_healthy_.Add({{"device", device}}).Set(healthy ? 1 : 0);
}

void ServerMetrics::RecordDeviceFault(const std::string& device) {
  device_faults_total_.Add({{"device", device}}).Increment();
}

void ServerMetrics::RecordDeviceReset(const std::string& device, bool ok) {
  device_resets_total_.Add({{"device", device}, {"result", ok ? "ok" : "failed"}}).Increment();
}

void ServerMetrics::SetDeviceInfo(const std::string& device, const std::string& name,
                                  const std::string& compute_capability) {
  device_info_.Add({{"device", device}, {"name", name}, {"compute_capability", compute_capability}})
      .Set(1);
}

void ServerMetrics::SetDeviceMemoryUsed(const std::string& device, double bytes) {
  device_memory_used_.Add({{"device", device}}).Set(bytes);
}

void ServerMetrics::SetDeviceMemoryTotal(const std::string& device, double bytes) {
  device_memory_total_.Add({{"device", device}}).Set(bytes);
}

std::string ServerMetrics::Serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace attnserve::metrics
