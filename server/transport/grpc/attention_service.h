// gRPC frontend on the callback API: each handler decodes, enqueues on the engine and returns
// at once; the device worker's completion finishes the reactor. No scheduling here.
// Forward and Backward are raw methods (request and response as bytes): the handler parses the
// request itself, so a body that is not the method's protobuf message gets INVALID_ARGUMENT
// saying so. gRPC's own parsing answers such a body, before any handler runs, with
// UNIMPLEMENTED and no message (grpc/grpc#30454).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_limits.h"
#include "server/transport/call_slots.h"
#include "server/transport/grpc/answer_reactor.h"

namespace attnserve::transport {

// The one place absl::Status becomes grpc::Status (their codes are the same numbers).
grpc::Status ToGrpcStatus(const absl::Status& status);

using RawComputeService = v1::AttentionService::WithRawCallbackMethod_Forward<
    v1::AttentionService::WithRawCallbackMethod_Backward<v1::AttentionService::CallbackService>>;

class AttentionServiceImpl final : public RawComputeService {
 public:
  // `engine`, `metrics`, `slots` and `auth` must outlive the service. `slots` is the
  // max_concurrent_requests budget it shares with the other transports. Every RPC needs
  // credentials that `auth` accepts; null: none needed. `advertise_address` is this replica's
  // own gRPC address ("host:port"), named in ForwardResponse.context_address and
  // ServerInfo.address so clients spread over several replicas send a context's backward here;
  // empty: unknown.
  AttentionServiceImpl(engine::Engine* engine, metrics::ServerMetrics* metrics,
                       std::string version, CallLimits limits, CallSlots* slots,
                       const Authenticator* auth = nullptr, std::string advertise_address = "");

  // The bytes of a v1::ForwardRequest in, of a v1::ForwardResponse out.
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  // The bytes of a v1::BackwardRequest in, of a v1::BackwardResponse out.
  grpc::ServerUnaryReactor* Backward(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  // Frees the caller's saved context; released = false when it had none by that id.
  grpc::ServerUnaryReactor* ReleaseContext(grpc::CallbackServerContext* context,
                                           const v1::ReleaseContextRequest* request,
                                           v1::ReleaseContextResponse* response) override;

 private:
  template <typename Job, typename Request, typename Response, typename Decode, typename Encode>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request_bytes,
                                  grpc::ByteBuffer* response_bytes, const char* rpc,
                                  Decode decode, Encode encode);
  void Finish(grpc::ServerUnaryReactor* reactor, const char* rpc, absl::Time start,
              const absl::Status& status);
  void Finish(AnswerReactor* reactor, const char* rpc, absl::Time start,
              const absl::Status& status);

  engine::Engine* const engine_;
  metrics::ServerMetrics* const metrics_;
  const std::string version_;
  const CallLimits limits_;
  CallSlots* const slots_;
  const Authenticator* const auth_;
  const std::string advertise_address_;
};

}  // namespace attnserve::transport
