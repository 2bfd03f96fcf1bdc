// The saved contexts of one server process (saved_context.h), by id. Each device has a byte
// budget; a new context that does not fit evicts that device's least-recently-used ones first,
// and one that would not fit even alone is not kept (the forward is still answered, with an
// empty context_id, and its client sends a full backward). A context unused for the TTL
// expires: a sweeper thread frees it within a sweep interval of its expiry, traffic or not.
// Contexts belong to the principal (token) that made them: to anyone else they do not exist.
//
// Ids are 128 random bits in hex from std::random_device (the kernel's CSPRNG on Linux), so
// they cannot be guessed.
//
// A context a running backward is using stays alive (shared ownership) until that backward
// ends even if it is evicted or expires meanwhile; its bytes then count for neither the store
// nor the budget for that moment. Evicting the most recently used context (the one a backward
// just looked up) happens only when nothing older is left to evict.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/engine/saved_context.h"
#include "server/metrics/context_metrics.h"

namespace attnserve::engine {

struct ContextStoreOptions {
  absl::Duration ttl = absl::Seconds(300);
  // How often expired contexts are freed; zero: only by Sweep() (tests).
  absl::Duration sweep_interval = absl::Milliseconds(250);
  std::function<absl::Time()> now = [] { return absl::Now(); };  // injectable for tests
};

class ContextStore {
 public:
  // `metrics` may be null; otherwise it must outlive the store.
  ContextStore(ContextStoreOptions options, metrics::ContextMetrics* metrics);
  // Stops the sweeper and frees every context still held.
  ~ContextStore();

  // Bytes of contexts `device` may hold; set before contexts of that device are added (a
  // device without a budget keeps none).
  void SetBudget(const std::string& device, int64_t bytes);
  int64_t Budget(const std::string& device) const;

  // Keeps `context` (device, principal, spec and memory set) and returns its new id; nullopt,
  // evicting nothing, when it cannot fit the device's budget even alone.
  std::optional<std::string> Add(std::unique_ptr<SavedContext> context);

  // The context, marked used now; NOT_FOUND naming the id when it is unknown, expired, evicted
  // or not `principal`'s.
  absl::StatusOr<std::shared_ptr<const SavedContext>> Lookup(const std::string& id,
                                                             const std::string& principal);

  // Drops the context; false when there was none of `principal`'s by that id.
  bool Release(const std::string& id, const std::string& principal);

  // Frees the contexts unused for the TTL.
  void Sweep();

  // Frees every context `device` holds (its memory is about to go with a reset of the device
  // after a fault); later lookups of them are NOT_FOUND, and clients resend in full.
  void DropDevice(const std::string& device);

  int64_t BytesOn(const std::string& device) const;
  int64_t CountOn(const std::string& device) const;
  absl::Duration ttl() const { return options_.ttl; }

 private:
  struct Entry {
    std::string id;
    std::shared_ptr<const SavedContext> context;
    int64_t bytes = 0;
    absl::Time last_used;
  };
  using Lru = std::list<Entry>;  // least recently used first
  struct Held {
    int64_t bytes = 0;
    int64_t count = 0;
  };

  // Takes the entry out of the store; the caller frees its context after unlocking (freeing
  // device memory may wait for the device).
  std::shared_ptr<const SavedContext> RemoveLocked(Lru::iterator it);
  bool ExpiredLocked(const Entry& entry, absl::Time now) const;
  void PublishLocked(const std::string& device);
  void SweepLoop();

  const ContextStoreOptions options_;
  metrics::ContextMetrics* const metrics_;

  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> by_id_;
  std::map<std::string, int64_t> budgets_;
  std::map<std::string, Held> held_;

  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread sweeper_;
};

}  // namespace attnserve::engine
