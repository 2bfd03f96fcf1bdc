// Per-request size limits the server enforces before any work (RESOURCE_EXHAUSTED when exceeded).
#pragma once

#include <cstdint>

namespace attnserve::engine {

struct Limits {
  int64_t max_message_bytes = int64_t{1} << 30;
  int64_t max_total_tokens = int64_t{1} << 20;  // query and key tokens counted separately
  int32_t max_head_dim = 256;
  int32_t max_num_heads = 1024;
  int32_t max_batch = 1 << 16;  // sequences per request
  // Longest a request may be estimated to run on the device it would run on
  // (work_estimate.h); 0 = no limit. 30 s: a GPU launch cannot be stopped part way, and a
  // device held that long stalls every request queued behind it; the largest requests of our
  // benchmarks (1x16384 tokens, 16 heads of 128, on an H100: ~0.05 s with its transfers) and
  // of our CPU tests (12,000 tokens of one head of 64 on one thread: ~10 s) fit with room.
  double max_request_compute_seconds = 30;
};

}  // namespace attnserve::engine
