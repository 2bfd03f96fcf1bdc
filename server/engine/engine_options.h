// How the engine runs: limits, CPU threads, batching and queue bounds (set from server flags).
#pragma once

#include <cstdint>

#include "server/engine/limits.h"
#include "server/engine/queue_worker.h"

namespace attnserve::engine {

struct EngineOptions {
  Limits limits;
  int cpu_threads = 0;  // reference kernel threads; 0 = all cores
  BatchingOptions batching;
  // Jobs a device may hold waiting; past it new jobs are refused with RESOURCE_EXHAUSTED
  // (backpressure instead of unbounded memory and latency).
  int64_t max_queue_size = 1024;
};

}  // namespace attnserve::engine
