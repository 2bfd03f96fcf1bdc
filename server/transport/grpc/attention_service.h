// gRPC frontend on the callback API: each handler decodes, enqueues on the engine and returns
// at once; the device worker's completion finishes the reactor. No scheduling here.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_limits.h"

namespace attnserve::transport {

// The one place absl::Status becomes grpc::Status (their codes are the same numbers).
grpc::Status ToGrpcStatus(const absl::Status& status);

// Per-call limits the transport enforces before a call reaches the engine.

class AttentionServiceImpl final : public v1::AttentionService::CallbackService {
 public:
  // `engine`, `metrics` and `auth` must outlive the service. Every RPC needs credentials that
  // `auth` accepts; null: none needed.
  AttentionServiceImpl(engine::Engine* engine, metrics::ServerMetrics* metrics,
                       std::string version, CallLimits limits = {},
                       const Authenticator* auth = nullptr);

  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const v1::ForwardRequest* request,
                                    v1::ForwardResponse* response) override;
  grpc::ServerUnaryReactor* Backward(grpc::CallbackServerContext* context,
                                     const v1::BackwardRequest* request,
                                     v1::BackwardResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;

 private:
  template <typename Job, typename Request, typename Response, typename Decode, typename Encode>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const Request* request,
                                  Response* response, const char* rpc, Decode decode,
                                  Encode encode);
  void Finish(grpc::ServerUnaryReactor* reactor, const char* rpc, absl::Time start,
              const absl::Status& status);
  // Takes one of max_concurrent_requests' slots; false (and nothing taken) when all are used.
  bool AcquireSlot();
  void ReleaseSlot();

  engine::Engine* const engine_;
  metrics::ServerMetrics* const metrics_;
  const std::string version_;
  const CallLimits limits_;
  const Authenticator* const auth_;
  std::atomic<int64_t> active_calls_{0};
};

}  // namespace attnserve::transport
