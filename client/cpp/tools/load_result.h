// What one attnload run (one concurrency level or rate) measured.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tools/latency_stats.h"

namespace attnserve::load {

struct RunResult {
  int concurrency = 0;     // closed loop; 0 for open loop
  double target_rate = 0;  // open loop, requests/s; 0 for closed loop
  std::string arrival;     // open loop: "constant" or "poisson"
  double elapsed_s = 0;    // from the end of warmup to the last measured completion
  std::string transport;   // "grpc" or "data"

  int64_t requests = 0;  // measured requests that completed, successfully or not
  int64_t errors = 0;    // failed calls plus --check mismatches
  int64_t forward = 0, backward = 0;
  int64_t checked = 0, mismatches = 0;
  int64_t tokens = 0;        // query tokens of successful requests
  double flops = 0;          // of successful requests
  int64_t payload_bytes = 0;  // request plus answer tensor bytes of successful requests
  LatencyHistogram latency;  // successful requests only: failures are often instant
  std::map<std::string, int64_t> errors_by_code;   // "RESOURCE_EXHAUSTED", "MISMATCH", ...
  std::map<std::string, std::string> first_error;  // code -> first message seen

  double throughput() const { return elapsed_s > 0 ? requests / elapsed_s : 0; }
  double tokens_per_s() const { return elapsed_s > 0 ? tokens / elapsed_s : 0; }
  double payload_gbps() const { return elapsed_s > 0 ? payload_bytes / elapsed_s / 1e9 : 0; }
  double tflops() const { return elapsed_s > 0 ? flops / elapsed_s / 1e12 : 0; }
  double error_rate() const { return requests > 0 ? static_cast<double>(errors) / requests : 0; }
};

}  // namespace attnserve::load
