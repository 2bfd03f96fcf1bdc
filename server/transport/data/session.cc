#include "server/transport/data/session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/transport/data/connection.h"
#include "server/transport/data/frame.h"

namespace attnserve::transport::data {
namespace {

// Ids of refused, cancelled or failed requests whose chunks are still dropped quietly; the
// oldest are forgotten past this many.
constexpr size_t kMaxTombstones = 4096;

}  // namespace

void DataCall::ReleaseBuffer() {
  response_buffer.reset();
  if (buffer == nullptr) return;
  buffer.reset();
  context->budget->Release(plan.payload_bytes);
}

Session::Session(std::string id, std::string principal, DataContext* context)
    : id_(std::move(id)), principal_(std::move(principal)), context_(context) {}

absl::Status Session::Join(std::shared_ptr<Connection> connection) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return absl::FailedPreconditionError("the session has ended");
  if (static_cast<int>(connections_.size()) >= context_->options.max_connections_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session already has data_max_connections_per_session = ",
                     context_->options.max_connections_per_session, " connections"));
  }
  connections_.push_back(std::move(connection));
  return absl::OkStatus();
}

bool Session::Leave(Connection* connection) {
  std::vector<OutFrame> orphans;
  std::map<uint64_t, std::shared_ptr<DataCall>> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (it->get() == connection) {
        connections_.erase(it);
        break;
      }
    }
    orphans = connection->Retire();
    if (!connections_.empty()) {
      for (OutFrame& frame : orphans) {
        connections_[next_connection_++ % connections_.size()]->Push(std::move(frame));
      }
      return false;
    }
    ended_ = true;
    abandoned.swap(calls_);
  }
  // Outside the lock: dropping the calls may free buffers and slots.
  for (auto& [id, call] : abandoned) call->cancelled->store(true);
  return true;
}

void Session::Send(std::vector<OutFrame> frames) {
  size_t bytes = 0;
  for (const OutFrame& frame : frames) bytes += frame.payload_size();
  std::lock_guard<std::mutex> lock(mu_);
  if (connections_.empty()) return;
  // A small answer travels whole on one connection: its RESPONSE and CHUNKs leave in one
  // sendmsg and the client waits on one reader. Spread over the connections, 64 clients of
  // 64-token forwards woke three writers and three client readers per call. Large answers
  // are still striped, for bandwidth.
  if (bytes <= static_cast<size_t>(context_->options.response_chunk_bytes)) {
    connections_[next_connection_++ % connections_.size()]->Push(std::move(frames));
    return;
  }
  for (OutFrame& frame : frames) {
    connections_[next_connection_++ % connections_.size()]->Push(std::move(frame));
  }
}

absl::Status Session::CheckIdFree(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (calls_.count(id) != 0) {
    return Violation(absl::StatusCode::kInvalidArgument, "duplicate_request",
                     absl::StrCat("request_id ", id, " is already in use in this session"));
  }
  return absl::OkStatus();
}

absl::Status Session::Register(std::shared_ptr<DataCall> call) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return absl::UnavailableError("the session has ended");
  if (calls_.count(call->id) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id ", call->id, " is already in use in this session"));
  }
  if (static_cast<int>(calls_.size()) >= context_->options.max_requests_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the session already has data_max_requests_per_session = ",
                     context_->options.max_requests_per_session, " requests in progress"));
  }
  if (tombstones_.erase(call->id) != 0) {
    tombstone_order_.erase(std::find(tombstone_order_.begin(), tombstone_order_.end(), call->id));
  }
  if (std::vector<int32_t> ends = GroupEnds(call->plan); !ends.empty()) {
    call->group_tracker.emplace(call->plan, ends);
    // Weak: the call owns its groups, and the session its calls.
    auto finished = [session = weak_from_this(), weak = std::weak_ptr<DataCall>(call)](int g) {
      std::shared_ptr<Session> self = session.lock();
      std::shared_ptr<DataCall> strong = weak.lock();
      if (self != nullptr && strong != nullptr) self->SendGroup(strong, g);
    };
    call->groups = std::make_shared<engine::SequenceGroups>(
        std::move(ends), Deadline(*call),
        [cancelled = call->cancelled] { return cancelled->load(); }, std::move(finished));
    for (int g : call->group_tracker->Empty()) call->groups->MarkArrived(g);
  }
  calls_.emplace(call->id, std::move(call));
  return absl::OkStatus();
}

void Session::Tombstone(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tombstones_.insert(id).second) return;
  tombstone_order_.push_back(id);
  if (tombstone_order_.size() > kMaxTombstones) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

absl::StatusOr<std::shared_ptr<DataCall>> Session::ClaimChunk(uint64_t id, uint64_t offset,
                                                              uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) {
    if (tombstones_.count(id) != 0) return nullptr;
    return Violation(absl::StatusCode::kInvalidArgument, "unknown_request",
                     absl::StrCat("CHUNK for request_id ", id,
                                  ", which is no request in progress in this session"));
  }
  if (absl::Status claimed = it->second->tracker->Claim(offset, length); !claimed.ok()) {
    return claimed;
  }
  return it->second;
}

void Session::ChunkArrived(const std::shared_ptr<DataCall>& call, uint64_t offset,
                           uint64_t length) {
  std::vector<int> completed;
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(call->id);
    if (it == calls_.end() || it->second != call) return;  // cancelled or failed meanwhile
    const bool complete = call->tracker->Arrived(length);
    if (complete) call->arrived = absl::Now();
    if (call->group_tracker) completed = call->group_tracker->Arrived(offset);
    start = !call->running && (complete || !completed.empty());
    if (start) call->running = true;
  }
  for (int g : completed) call->groups->MarkArrived(g);
  if (start) Run(call);
}

bool Session::Forget(const std::shared_ptr<DataCall>& call, bool tombstone) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(call->id);
    if (it == calls_.end() || it->second != call) return false;
    calls_.erase(it);
  }
  if (tombstone) Tombstone(call->id);
  return true;
}

void Session::Fail(const std::shared_ptr<DataCall>& call, const absl::Status& status) {
  if (!Forget(call, /*tombstone=*/true)) return;
  call->cancelled->store(true);  // a grouped call the engine has stops waiting for its bytes
  context_->metrics->RecordRequest(call->rpc, absl::StatusCodeToString(status.code()),
                                   absl::ToDoubleSeconds(absl::Now() - call->start));
  context_->data_metrics->RecordRequest(call->rpc, absl::StatusCodeToString(status.code()));
  Send({StatusResponseFrame(call->id, status)});
}

void Session::Cancel(uint64_t id) {
  std::shared_ptr<DataCall> call;
  bool receiving = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return;  // unknown, or its answer is already on its way
    call = it->second;
    receiving = !call->tracker->complete();
  }
  call->cancelled->store(true);
  // A receiving call's chunks may still be in flight on other connections.
  Forget(call, /*tombstone=*/receiving);
}

void Session::ExpireTransfers(absl::Time now) {
  std::vector<std::shared_ptr<DataCall>> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, call] : calls_) {
      if (!call->tracker->complete() && now > call->transfer_deadline) late.push_back(call);
    }
  }
  for (const std::shared_ptr<DataCall>& call : late) {
    Fail(call, absl::DeadlineExceededError(absl::StrCat(
                   "the request's ", call->plan.payload_bytes,
                   "-byte payload did not arrive within data_transfer_timeout_seconds = ",
                   absl::ToInt64Seconds(context_->options.transfer_timeout))));
  }
}

}  // namespace attnserve::transport::data
