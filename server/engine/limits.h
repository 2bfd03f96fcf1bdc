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
};

}  // namespace attnserve::engine
