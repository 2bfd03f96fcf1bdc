#include "server/metrics/server_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ServerMetricsTest, ExportsTheDesignedNamesWithLabels) {
  ServerMetrics metrics("1.2.3");
  metrics.RecordRequest("Forward", "OK", 0.002);
  metrics.RecordRequest("Forward", "INVALID_ARGUMENT", 0.0001);
  metrics.RecordExecution("Forward", "reference", "cpu", 0.001, 0.01, 512, 2e9);
  metrics.RecordCodePath("Forward", "reference/cpu", "cpu", 0.01);
  metrics.SetDeviceMemoryTotal("cpu", 8192);
  metrics.RecordBatch(3);
  metrics.RecordRejection("queue_full");
  metrics.RecordAuthFailure("invalid");
  metrics.AddReceivedBytes(1000);
  metrics.AddSentBytes(400);
  metrics.AddInflight(2);
  metrics.SetQueueDepth("cpu", 3);
  metrics.SetDeviceInfo("cpu", "Some CPU", "");
  metrics.SetDeviceMemoryUsed("cpu", 4096);
  metrics.RecordPlacement("cuda:1", "flash");
  metrics.SetDeviceLoad("cuda:1", 0.25, 1 << 20);
  metrics.RecordMemoryWait("cuda:1");
  metrics.RecordPriorityQueueDuration("low", 0.003);
  metrics.RecordLaunchPhase("cuda:1", "stage_in", 0.001);
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("attnserve_requests_total{code=\"OK\",rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_auth_failures_total{reason=\"invalid\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("attnserve_requests_total{code=\"INVALID_ARGUMENT\",rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_request_duration_seconds_count{rpc=\"Forward\"} 2"));
  EXPECT_THAT(text, HasSubstr("attnserve_queue_duration_seconds_count{rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_compute_duration_seconds_count{device=\"cpu\","
                              "kernel=\"reference\",rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_code_path_compute_duration_seconds_count{code_path="
                              "\"reference/cpu\",device=\"cpu\",rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_tokens_total{rpc=\"Forward\"} 512"));
  EXPECT_THAT(text, HasSubstr("attnserve_flops_total{device=\"cpu\",kernel=\"reference\","
                              "rpc=\"Forward\"} 2000000000"));
  EXPECT_THAT(text, HasSubstr("attnserve_device_memory_total_bytes{device=\"cpu\"} 8192"));
  EXPECT_THAT(text, HasSubstr("attnserve_received_bytes_total 1000"));
  EXPECT_THAT(text, HasSubstr("attnserve_sent_bytes_total 400"));
  EXPECT_THAT(text, HasSubstr("attnserve_inflight_requests 2"));
  EXPECT_THAT(text, HasSubstr("attnserve_queue_depth{device=\"cpu\"} 3"));
  EXPECT_THAT(text, HasSubstr("attnserve_batch_requests_count 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_batch_requests_sum 3"));
  EXPECT_THAT(text, HasSubstr("attnserve_rejections_total{reason=\"queue_full\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_device_info{compute_capability=\"\",device=\"cpu\","
                              "name=\"Some CPU\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_device_memory_used_bytes{device=\"cpu\"} 4096"));
  EXPECT_THAT(text, HasSubstr("attnserve_build_info{version=\"1.2.3\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_placements_total{device=\"cuda:1\",kernel=\"flash\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_device_queued_work_seconds{device=\"cuda:1\"} 0.25"));
  EXPECT_THAT(text, HasSubstr("attnserve_device_memory_reserved_bytes{device=\"cuda:1\"} 1048576"));
  EXPECT_THAT(text, HasSubstr("attnserve_memory_waits_total{device=\"cuda:1\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("attnserve_priority_queue_duration_seconds_count{priority=\"low\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_launch_phase_duration_seconds_count{device=\"cuda:1\","
                              "phase=\"stage_in\"} 1"));
}

}  // namespace
}  // namespace attnserve::metrics
