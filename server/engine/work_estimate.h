// How long a request runs on a device: the rough rate table placement ranks devices by and
// admission bounds a request's compute with (--max_request_compute_seconds).
//
// A request's time is its FLOPs over the FLOP rate of the kernel family the router picks, plus
// its attention scores over the family's score rate, plus (families that run on a GPU) its
// bytes over the host link. FLOPs alone miss what dominates at small head_dim: each score costs
// a scale, a max, an exp and a sum whatever head_dim is, so one 32,768-token sequence at
// head_dim 1 (4 GFLOP) held the 2-core CPU device ~19 s. The limit is in estimated seconds
// rather than FLOPs or scores because devices differ by orders of magnitude: the same work is
// microseconds on an H100 and hours on the host CPU, and a GPU launch, which cannot be stopped
// part way, must be bounded as much as the CPU's (which stops at its deadline).
#pragma once

#include <string>

#include "server/engine/request_cost.h"

namespace attnserve::engine {

// What one request reaches per second with a family on a device.
struct Throughput {
  double flops = 0;        // attention FLOPs (request_cost.h's convention) per second
  double scores = 0;       // attention scores (ScoreWork) per second
  double link_bytes = 0;   // host <-> device bytes per second; 0: runs on the host
};

// Whether a family runs on the GPU (its bytes cross the host link and occupy device memory);
// "reference" runs on the host CPU, whatever device's queue it came through.
bool RunsOnGpu(const std::string& family, int compute_capability);

// `compute_capability` 0 is the host CPU itself; `host_threads` is how many threads the
// reference kernels give one request on the host (--cpu_threads, resolved).
Throughput FamilyThroughput(const std::string& family, int compute_capability, int host_threads);

// The request's estimated run time with `family` on that device.
double EstimatedSeconds(const RequestProfile& request, const std::string& family,
                        int compute_capability, int host_threads);

}  // namespace attnserve::engine
