#include "server/transport/grpc/health_service.h"

#include <optional>
#include <utility>

#include "common/grpc_tsan_handoff.h"
#include "server/transport/grpc/attention_service.h"
#include "server/transport/grpc/call_auth.h"

namespace attnserve::transport {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr char kAttentionService[] = "attnserve.v1.AttentionService";

}  // namespace

// One Watch stream: sends the current status, then every change, one write at a time. gRPC
// may run reactions on any thread, so state is guarded by mu_, and gRPC is called outside it.
class HealthService::Watcher : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  // Registers with `service` unless `refusal` is an error, in which case the stream ends
  // with it at once.
  Watcher(HealthService* service, std::string name, const grpc::Status& refusal)
      : service_(service), name_(std::move(name)) {
    if (!refusal.ok()) {
      finished_ = true;
      End(refusal);
      return;
    }
    // Registered and first updated under the service's lock, as Publish updates, so a change
    // published meanwhile cannot be overtaken by this older status.
    std::lock_guard<std::mutex> lock(service_->mu_);
    service_->watchers_.insert(this);
    Update(service_->StatusOf(name_));
  }

  const std::string& name() const { return name_; }

  void Update(ServingStatus status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ending_ || finished_) return;
      pending_ = status;
      if (writing_ || !TakePendingLocked()) return;
    }
    Send();
  }

  void OnWriteDone(bool ok) override {
    TakeBackFromGrpc(this);
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) ending_ = true;  // the stream broke: end it
      if (ending_) {
        finish = TakeFinishLocked();
      } else if (!TakePendingLocked()) {
        return;
      }
    }
    if (finish) {
      End(grpc::Status::CANCELLED);
    } else {
      Send();
    }
  }

  // Finishing waits for a write in flight (as gRPC's own health service does): OnWriteDone
  // finishes instead.
  void OnCancel() override {
    TakeBackFromGrpc(this);
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ending_ = true;
      finish = TakeFinishLocked();
    }
    if (finish) End(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    TakeBackFromGrpc(this);
    service_->Remove(this);
    delete this;
  }

 private:
  // Every call into gRPC goes through these two, so TSan builds see the reactions that follow
  // ordered after it (common/grpc_tsan_handoff.h); each reaction starts with TakeBackFromGrpc.
  void Send() {
    HandOffToGrpc(this);
    StartWrite(&response_);
  }
  void End(const grpc::Status& status) {
    HandOffToGrpc(this);
    Finish(status);
  }

  // True once: when the stream should be finished now (no write in flight). mu_ held.
  bool TakeFinishLocked() {
    if (finished_ || writing_) return false;
    finished_ = true;
    return true;
  }

  // Moves a pending status that differs from the last one sent into response_; false if
  // there is nothing new to send. mu_ held.
  bool TakePendingLocked() {
    if (!pending_.has_value() || pending_ == last_sent_) return false;
    response_.set_status(*pending_);
    last_sent_ = pending_;
    pending_.reset();
    writing_ = true;
    return true;
  }

  HealthService* const service_;
  const std::string name_;
  std::mutex mu_;
  bool ending_ = false;    // cancelled or broken: finish when no write is in flight
  bool finished_ = false;  // Finish called
  bool writing_ = false;
  std::optional<ServingStatus> pending_;
  std::optional<ServingStatus> last_sent_;
  HealthCheckResponse response_;
};

HealthService::HealthService(const Authenticator* auth, std::function<bool()> ready,
                             absl::Duration poll_interval)
    : auth_(auth), ready_probe_(std::move(ready)) {
  if (ready_probe_) poller_ = std::thread([this, poll_interval] { PollReady(poll_interval); });
}

HealthService::~HealthService() { StopPolling(); }

HealthService::ServingStatus HealthService::StatusOf(const std::string& service) const {
  if (!service.empty() && service != kAttentionService) return HealthCheckResponse::SERVICE_UNKNOWN;
  return serving_ && ready_ && !shut_down_ ? HealthCheckResponse::SERVING
                                           : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetServing(bool serving) { Publish(serving); }

void HealthService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
  }
  Publish(false);
  StopPolling();
}

void HealthService::Publish(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = serving;
  // Watchers take their own lock only; Remove (which takes mu_) runs from OnDone, never from
  // inside Update, so this cannot deadlock.
  for (Watcher* watcher : watchers_) watcher->Update(StatusOf(watcher->name()));
}

void HealthService::RefreshReady() {
  if (!ready_probe_) return;
  // Asked outside mu_: the probe takes the engine's locks, which must never wait on ours.
  const bool ready = ready_probe_();
  std::lock_guard<std::mutex> lock(mu_);
  if (ready == ready_) return;
  ready_ = ready;
  for (Watcher* watcher : watchers_) watcher->Update(StatusOf(watcher->name()));
}

void HealthService::PollReady(absl::Duration interval) {
  std::unique_lock<std::mutex> lock(poll_mu_);
  while (!poll_cv_.wait_for(lock, absl::ToChronoNanoseconds(interval),
                            [this] { return stop_polling_; })) {
    lock.unlock();
    RefreshReady();
    lock.lock();
  }
}

void HealthService::StopPolling() {
  {
    std::lock_guard<std::mutex> lock(poll_mu_);
    stop_polling_ = true;
  }
  poll_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

void HealthService::Remove(Watcher* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status refusal = ToGrpcStatus(AuthenticateCall(auth_, *context)); !refusal.ok()) {
    reactor->Finish(refusal);
    return reactor;
  }
  RefreshReady();
  ServingStatus status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = StatusOf(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "unknown service '" + request->service() + "'"));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  return new Watcher(this, request->service(), ToGrpcStatus(AuthenticateCall(auth_, *context)));
}

}  // namespace attnserve::transport
