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
  metrics.SetDeviceMemoryTotal("cpu", 8192);
  metrics.RecordBatch(3);
  metrics.RecordRejection("queue_full");
  metrics.AddReceivedBytes(1000);
  metrics.AddSentBytes(400);
  metrics.AddInflight(2);
  metrics.SetQueueDepth("cpu", 3);
  metrics.SetDeviceInfo("cpu", "Some CPU", "");
  metrics.SetDeviceMemoryUsed("cpu", 4096);
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("attnserve_requests_total{code=\"OK\",rpc=\"Forward\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("attnserve_requests_total{code=\"INVALID_ARGUMENT\",rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_request_duration_seconds_count{rpc=\"Forward\"} 2"));
  EXPECT_THAT(text, HasSubstr("attnserve_queue_duration_seconds_count{rpc=\"Forward\"} 1"));
  EXPECT_THAT(text, HasSubstr("attnserve_compute_duration_seconds_count{device=\"cpu\","
                              "kernel=\"reference\",rpc=\"Forward\"} 1"));
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
}

}  // namespace
}  // namespace attnserve::metrics
