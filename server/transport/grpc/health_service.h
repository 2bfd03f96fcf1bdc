// grpc.health.v1 (Check and Watch) for the whole server ("") and attnserve.v1.AttentionService.
// Served here rather than by gRPC's built-in service so that, when health is not open, callers
// need the same bearer token as the compute RPCs. SERVING follows the server's readiness as
// /readyz does (no device in service after faults means NOT_SERVING), so load balancers that
// probe gRPC move traffic away as those that probe HTTP do.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/transport/auth/authenticator.h"

namespace attnserve::transport {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // `auth` null: open to every caller. It must outlive the service, and the service must
  // outlive the gRPC server it is registered with. `ready` (may be empty: always ready) is
  // asked on every Check and every `poll_interval`, so that watchers hear of its changes; it
  // must outlive the service and be safe from any thread.
  explicit HealthService(const Authenticator* auth, std::function<bool()> ready = nullptr,
                         absl::Duration poll_interval = absl::Milliseconds(200));
  ~HealthService() override;

  // SERVING (while `ready` says so too) or NOT_SERVING; watchers hear of every change.
  void SetServing(bool serving);
  // NOT_SERVING from now on, whatever SetServing says later (the server is shutting down).
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;

  ServingStatus StatusOf(const std::string& service) const;  // mu_ held
  void Publish(bool serving);
  // Asks `ready_` and tells watchers if its answer changed.
  void RefreshReady();
  void PollReady(absl::Duration interval);
  void StopPolling();
  void Remove(Watcher* watcher);

  const Authenticator* const auth_;
  const std::function<bool()> ready_probe_;
  mutable std::mutex mu_;
  bool serving_ = false;
  bool ready_ = true;  // the probe's last answer
  bool shut_down_ = false;
  std::set<Watcher*> watchers_;

  std::mutex poll_mu_;
  std::condition_variable poll_cv_;
  bool stop_polling_ = false;
  std::thread poller_;
};

}  // namespace attnserve::transport
