#include "server/engine/context_store.h"

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/engine/error_text.h"

namespace attnserve::engine {
namespace {

std::string NewId() {
  static std::mutex mu;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(mu);
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&id, "%08x", device());
  return id;
}

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat(
      "context_id ", QuoteString(id),
      ": no such context (unknown, expired, evicted or released); send the backward in full"));
}

}  // namespace

ContextStore::ContextStore(ContextStoreOptions options, metrics::ContextMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {
  if (options_.sweep_interval > absl::ZeroDuration()) {
    sweeper_ = std::thread([this] { SweepLoop(); });
  }
}

ContextStore::~ContextStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

void ContextStore::SetBudget(const std::string& device, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budgets_[device] = bytes;
  PublishLocked(device);
}

int64_t ContextStore::Budget(const std::string& device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = budgets_.find(device);
  return it == budgets_.end() ? 0 : it->second;
}

std::optional<std::string> ContextStore::Add(std::unique_ptr<SavedContext> context) {
  const std::string device = context->device;
  const int64_t bytes = context->memory->bytes();
  std::vector<std::shared_ptr<const SavedContext>> evicted;
  std::optional<std::string> id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto budget = budgets_.find(device);
    if (budget == budgets_.end() || bytes > budget->second) return std::nullopt;
    Held& held = held_[device];
    for (auto it = lru_.begin(); it != lru_.end() && held.bytes + bytes > budget->second;) {
      if (it->context->device != device) {
        ++it;
        continue;
      }
      if (metrics_ != nullptr) metrics_->RecordEviction(device, "lru");
      evicted.push_back(RemoveLocked(it++));
    }
    do {
      id = NewId();
    } while (by_id_.count(*id) != 0);
    lru_.push_back({*id, std::move(context), bytes, options_.now()});
    by_id_[*id] = std::prev(lru_.end());
    held.bytes += bytes;
    ++held.count;
    PublishLocked(device);
  }
  return id;  // `evicted` is freed here, outside the lock
}

absl::StatusOr<std::shared_ptr<const SavedContext>> ContextStore::Lookup(
    const std::string& id, const std::string& principal) {
  std::shared_ptr<const SavedContext> expired;
  std::lock_guard<std::mutex> lock(mu_);
  auto found = by_id_.find(id);
  const absl::Time now = options_.now();
  if (found != by_id_.end() && ExpiredLocked(*found->second, now)) {
    // Expired but not yet swept: as good as gone.
    if (metrics_ != nullptr) metrics_->RecordEviction(found->second->context->device, "ttl");
    expired = RemoveLocked(found->second);
    found = by_id_.end();
  }
  const bool hit = found != by_id_.end() && found->second->context->principal == principal;
  if (metrics_ != nullptr) metrics_->RecordLookup(hit);
  if (!hit) return NotFound(id);
  Lru::iterator it = found->second;
  it->last_used = now;
  lru_.splice(lru_.end(), lru_, it);  // most recently used last; iterators stay valid
  return it->context;
}

bool ContextStore::Release(const std::string& id, const std::string& principal) {
  std::shared_ptr<const SavedContext> released;
  std::lock_guard<std::mutex> lock(mu_);
  auto found = by_id_.find(id);
  if (found == by_id_.end() || found->second->context->principal != principal) return false;
  if (metrics_ != nullptr) metrics_->RecordRelease();
  released = RemoveLocked(found->second);
  return true;
}

void ContextStore::Sweep() {
  std::vector<std::shared_ptr<const SavedContext>> expired;
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = options_.now();
  // Least recently used first, so the expired ones lead the list.
  while (!lru_.empty() && ExpiredLocked(lru_.front(), now)) {
    if (metrics_ != nullptr) metrics_->RecordEviction(lru_.front().context->device, "ttl");
    expired.push_back(RemoveLocked(lru_.begin()));
  }
}

void ContextStore::DropDevice(const std::string& device) {
  std::vector<std::shared_ptr<const SavedContext>> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->context->device == device) {
      if (metrics_ != nullptr) metrics_->RecordEviction(device, "device_fault");
      dropped.push_back(RemoveLocked(it));
    }
    it = next;
  }
}

int64_t ContextStore::BytesOn(const std::string& device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(device);
  return it == held_.end() ? 0 : it->second.bytes;
}

int64_t ContextStore::CountOn(const std::string& device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(device);
  return it == held_.end() ? 0 : it->second.count;
}

std::shared_ptr<const SavedContext> ContextStore::RemoveLocked(Lru::iterator it) {
  const std::string& device = it->context->device;
  Held& held = held_[device];
  held.bytes -= it->bytes;
  --held.count;
  PublishLocked(device);
  std::shared_ptr<const SavedContext> context = std::move(it->context);
  by_id_.erase(it->id);
  lru_.erase(it);
  return context;
}

bool ContextStore::ExpiredLocked(const Entry& entry, absl::Time now) const {
  return now - entry.last_used >= options_.ttl;
}

void ContextStore::PublishLocked(const std::string& device) {
  if (metrics_ == nullptr) return;
  const Held& held = held_[device];
  metrics_->SetHeld(device, static_cast<double>(held.count), static_cast<double>(held.bytes));
}

void ContextStore::SweepLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.sweep_interval));
    if (stopping_) return;
    lock.unlock();
    Sweep();
    lock.lock();
  }
}

}  // namespace attnserve::engine
