// How the engine runs: limits, CPU threads, batching, queue bounds, memory budgets and priority
// aging (set from server flags).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "server/engine/fault_injection.h"
#include "server/engine/limits.h"

namespace attnserve::engine {

struct BatchingOptions {
  bool enabled = false;  // see the --batching flag
  // Most query (and, separately, key) tokens one launch may carry.
  int64_t max_batch_tokens = 1 << 16;
  // How long the oldest job may wait for compatible company (Triton's
  // max_queue_delay_microseconds); 0 merges only what is already queued.
  absl::Duration max_queue_delay = absl::ZeroDuration();
};

// Saved contexts (context_store.h).
struct ContextOptions {
  // Bytes of saved contexts each device may hold (never more than its memory budget). 0: a
  // quarter of the device's memory budget. A context is about its forward's inputs plus output,
  // and the backward that consumes it needs about as much again beside it (dout, dq, dk, dv),
  // so a quarter keeps half of the device for the requests that run meanwhile; on an 80 GB H100
  // that is ~75 contexts of a 1x16384-token, 16-head, head_dim-128 bf16 step (257 MB each).
  // A device of unknown size keeps contexts only with an explicit budget.
  int64_t memory_bytes = 0;
  // A context unused this long is freed.
  absl::Duration ttl = absl::Seconds(300);
};

struct EngineOptions {
  Limits limits;
  int cpu_threads = 0;  // reference kernel threads per request; 0 = all cores
  // Requests the CPU device runs at once (each with cpu_threads threads).
  int cpu_lanes = 1;
  // Requests a CUDA device runs at once, each on its own stream with its own pinned staging,
  // so one request's host copies overlap another's transfers and kernels.
  int cuda_lanes = 2;
  // Threads per CUDA lane that gather a request's inputs of 8 MB and more into pinned memory
  // (one memcpy thread moves ~5.5 GB/s; parallel_copy.h says where more pay).
  int stage_threads_per_lane = 4;
  // Threads per lane that deliver answers (encode, serialize, finish the call) off the lanes.
  // A batched launch posts all of its requests' answers at once: two threads halved their
  // delivery time (3.4 against 6.1 ms) but not the batch's throughput or p99, so one by default.
  int answer_threads_per_lane = 1;
  // A GPU request (or batch), or a CPU backward, estimated to keep its device longer than this
  // runs as several launches, and stops between them once its deadline passed or its caller
  // left (launch_split.h): how long a stopped request may still hold a GPU. 0: one launch
  // always.
  double max_launch_seconds = 0.25;
  BatchingOptions batching;
  // Jobs a device may hold waiting; past it new jobs are refused with RESOURCE_EXHAUSTED
  // (backpressure instead of unbounded memory and latency). Jobs waiting for memory count.
  int64_t max_queue_size = 1024;
  // Bytes of each device's memory running requests may hold at once (0 = the device's total).
  // A request that fits the budget but not what running requests leave waits in the queue.
  int64_t device_memory_bytes = 0;
  // Waiting this long lifts a job one priority level (priority.h).
  absl::Duration priority_aging = absl::Milliseconds(500);
  // --kernel: run every request on this one family (tests); requests it can't run fail with
  // FAILED_PRECONDITION. Empty: the routing table chooses among every built family.
  std::string forced_kernel_family;
  ContextOptions contexts;
  // Page-locked receive buffers kept for reuse after their requests (GPU hosts; see
  // pinned_host_buffers.h), so steady traffic pins nothing new (--pinned_host_cache_bytes).
  size_t pinned_host_cache_bytes = size_t{16} << 30;
  // After a device fault, the first reset of the device is tried at once, then again after
  // this, doubling up to kMaxDeviceResetInterval (device_health.h).
  absl::Duration device_reset_interval = absl::Seconds(1);
  // Test-only (--inject_device_fault): launches that fail as device faults, by device name.
  std::map<std::string, InjectedFault> injected_faults;
};

}  // namespace attnserve::engine
