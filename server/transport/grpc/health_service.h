// grpc.health.v1 (Check and Watch) for the whole server ("") and attnserve.v1.AttentionService.
// Served here rather than by gRPC's built-in service so that, when health is not open, callers
// need the same bearer token as the compute RPCs.
#pragma once

#include <mutex>
#include <set>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/transport/auth/authenticator.h"

namespace attnserve::transport {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // `auth` null: open to every caller. It must outlive the service, and the service must
  // outlive the gRPC server it is registered with.
  explicit HealthService(const Authenticator* auth);

  // SERVING or NOT_SERVING; watchers hear of every change.
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
  void Remove(Watcher* watcher);

  const Authenticator* const auth_;
  mutable std::mutex mu_;
  bool serving_ = false;
  bool shut_down_ = false;
  std::set<Watcher*> watchers_;
};

}  // namespace attnserve::transport
