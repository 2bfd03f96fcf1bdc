// Every Prometheus metric the server exports (DESIGN.md's list), behind named methods so
// callers never touch label plumbing. Thread-safe: prometheus-cpp families lock on Add and the
// metrics themselves are atomic.
#pragma once

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics/child_cache.h"

namespace attnserve::metrics {

class ServerMetrics {
 public:
  explicit ServerMetrics(const std::string& version);

  // Transport side: one call per finished RPC.
  void RecordRequest(const std::string& rpc, const std::string& code, double duration_seconds);
  void AddReceivedBytes(double bytes);
  void AddSentBytes(double bytes);
  void AddInflight(double delta);

  // Engine side: one call per executed request, one per launch, one per refused request.
  void RecordExecution(const std::string& rpc, const std::string& kernel,
                       const std::string& device, double queue_seconds, double compute_seconds,
                       double tokens, double flops);
  // The same request's compute time by the kernel family and code path that ran it
  // ("flash/sm90", Execution.code_path), so an operator sees which path serves the traffic.
  void RecordCodePath(const std::string& rpc, const std::string& code_path,
                      const std::string& device, double compute_seconds);
  void RecordBatch(int requests);
  void RecordRejection(const std::string& reason);
  void SetQueueDepth(const std::string& device, double depth);

  // Scheduler side: where requests were placed, what each device holds, who waited and why.
  void RecordPlacement(const std::string& device, const std::string& kernel);
  void SetDeviceLoad(const std::string& device, double queued_seconds, double reserved_bytes);
  void RecordMemoryWait(const std::string& device);
  void RecordPriorityQueueDuration(const std::string& priority, double seconds);
  // A GPU request (or batch) too long for one launch ran as `launches` launches
  // (engine/launch_split.h): counts the requests and their launches.
  void RecordSplitLaunches(const std::string& device, size_t launches);
  // Where a launch's time goes: on a GPU lane "stage_in" (host tensors into pinned memory),
  // "device" (transfers and kernels, waited for), "stage_out" (results out of pinned memory);
  // on every device "answer" (from the lane's hand-off until the answer thread has encoded and
  // serialized the response and finished the call).
  void RecordLaunchPhase(const std::string& device, const std::string& phase, double seconds);

  // Authentication side: one call per refused call or HTTP request (reason: missing,
  // malformed or invalid credentials).
  void RecordAuthFailure(const std::string& reason);

  // Device registry side.
  void SetDeviceInfo(const std::string& device, const std::string& name,
                     const std::string& compute_capability);
  void SetDeviceMemoryUsed(const std::string& device, double bytes);
  void SetDeviceMemoryTotal(const std::string& device, double bytes);
  // Device health (engine/device_health.h): 1 while a device serves, 0 after a fault until a
  // reset of it succeeds; faults seen; reset attempts by result ("ok", "failed").
  void SetDeviceHealthy(const std::string& device, bool healthy);
  void RecordDeviceFault(const std::string& device);
  void RecordDeviceReset(const std::string& device, bool ok);

  // Prometheus text exposition format (version 0.0.4) of every metric.
  std::string Serialize() const;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& queue_duration_;
  prometheus::Family<prometheus::Histogram>& compute_duration_;
  prometheus::Family<prometheus::Histogram>& code_path_duration_;
  prometheus::Family<prometheus::Counter>& tokens_total_;
  prometheus::Family<prometheus::Counter>& flops_total_;
  prometheus::Counter& received_bytes_;
  prometheus::Counter& sent_bytes_;
  prometheus::Gauge& inflight_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Histogram& batch_requests_;
  prometheus::Family<prometheus::Gauge>& device_info_;
  prometheus::Family<prometheus::Gauge>& device_memory_used_;
  prometheus::Family<prometheus::Gauge>& device_memory_total_;
  prometheus::Family<prometheus::Counter>& rejections_total_;
  prometheus::Family<prometheus::Counter>& auth_failures_total_;
  prometheus::Family<prometheus::Counter>& placements_total_;
  prometheus::Family<prometheus::Gauge>& queued_work_;
  prometheus::Family<prometheus::Gauge>& memory_reserved_;
  prometheus::Family<prometheus::Counter>& memory_waits_total_;
  prometheus::Family<prometheus::Counter>& split_requests_total_;
  prometheus::Family<prometheus::Counter>& split_launches_total_;
  prometheus::Family<prometheus::Histogram>& priority_queue_duration_;
  prometheus::Family<prometheus::Histogram>& launch_phase_duration_;
  // The children recorded per request, by label values (child_cache.h).
  ChildCache<prometheus::Counter> request_counts_, tokens_counts_, flops_counts_,
      placement_counts_;
  ChildCache<prometheus::Histogram> request_durations_, queue_durations_, compute_durations_,
      code_path_durations_,
      priority_queue_durations_, launch_phase_durations_;
  ChildCache<prometheus::Gauge> queue_depths_, queued_work_gauges_, memory_reserved_gauges_;
  prometheus::Family<prometheus::Gauge>& device_healthy_;
  prometheus::Family<prometheus::Counter>& device_faults_total_;
  prometheus::Family<prometheus::Counter>& device_resets_total_;
};

}  // namespace attnserve::metrics
