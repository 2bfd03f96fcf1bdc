// What every part of the data channel shares: its options and the server's services, the
// budget of buffered request bytes, and the lease that holds a call's concurrency slot.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/metrics/data_metrics.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_slots.h"

namespace attnserve::transport::data {

struct DataServerOptions {
  std::string host = "0.0.0.0";
  int port = 8002;  // 0 picks a free one
  int max_connections = 256;
  int max_connections_per_session = 16;
  int max_requests_per_session = 64;
  int64_t max_chunk_bytes = int64_t{16} << 20;
  int64_t max_buffered_bytes = int64_t{8} << 30;
  // A request's payload must be complete this long after its REQUEST; a frame that stalls
  // this long mid-way, or a send the client does not read for this long, closes the
  // connection.
  absl::Duration transfer_timeout = absl::Seconds(60);
  absl::Duration hello_timeout = absl::Seconds(5);
  int64_t response_chunk_bytes = int64_t{4} << 20;
  int socket_buffer_bytes = 4 << 20;
  // As CallLimits::max_deadline: the longest a call may wait queued.
  absl::Duration max_deadline = absl::InfiniteDuration();
};

// Bytes of request payload buffered at once, over all sessions (--data_max_buffered_bytes).
class BufferBudget {
 public:
  BufferBudget(int64_t max_bytes, metrics::DataMetrics* metrics)
      : max_(max_bytes), metrics_(metrics) {}
  bool TryReserve(int64_t bytes);
  void Release(int64_t bytes);

 private:
  const int64_t max_;
  metrics::DataMetrics* const metrics_;
  std::atomic<int64_t> used_{0};
};

struct DataContext {
  DataServerOptions options;
  engine::Engine* engine = nullptr;
  metrics::ServerMetrics* metrics = nullptr;
  metrics::DataMetrics* data_metrics = nullptr;
  CallSlots* slots = nullptr;
  const Authenticator* auth = nullptr;  // null: no tokens needed
  BufferBudget* budget = nullptr;
  // Set when draining: new connections and REQUESTs are refused (UNAVAILABLE).
  std::atomic<bool> refusing{false};
  // Calls holding a slot (received, running or sending); the drain waits for zero.
  std::mutex calls_mu;
  std::condition_variable calls_cv;
  int64_t calls = 0;
};

// One call's max_concurrent_requests slot, held from its REQUEST until its response is sent
// (or dropped); also what the drain counts.
class SlotLease {
 public:
  static absl::StatusOr<std::unique_ptr<SlotLease>> Acquire(DataContext* context);
  ~SlotLease();
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;

 private:
  explicit SlotLease(DataContext* context) : context_(context) {}
  DataContext* const context_;
};

}  // namespace attnserve::transport::data
