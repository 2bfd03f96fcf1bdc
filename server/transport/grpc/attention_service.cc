#include "server/transport/grpc/attention_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/transport/grpc/call_auth.h"
#include "server/transport/grpc/proto_codec.h"
#include "server/transport/server_info.h"

namespace attnserve::transport {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

AttentionServiceImpl::AttentionServiceImpl(engine::Engine* engine,
                                           metrics::ServerMetrics* metrics, std::string version,
                                           CallLimits limits, const Authenticator* auth)
    : engine_(engine),
      metrics_(metrics),
      version_(std::move(version)),
      limits_(limits),
      auth_(auth) {}

bool AttentionServiceImpl::AcquireSlot() {
  const int64_t before = active_calls_.fetch_add(1, std::memory_order_relaxed);
  if (limits_.max_concurrent_requests > 0 && before >= limits_.max_concurrent_requests) {
    active_calls_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void AttentionServiceImpl::ReleaseSlot() { active_calls_.fetch_sub(1, std::memory_order_relaxed); }

void AttentionServiceImpl::Finish(grpc::ServerUnaryReactor* reactor, const char* rpc,
                                  absl::Time start, const absl::Status& status) {
  metrics_->RecordRequest(rpc, absl::StatusCodeToString(status.code()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  reactor->Finish(ToGrpcStatus(status));
}

// Forward and Backward share this flow: decode, enqueue, and let the worker's completion
// encode the result and finish the call. The request stays alive until Finish, which is what
// lets the engine read the tensors in place.
template <typename Job, typename Request, typename Response, typename Decode, typename Encode>
grpc::ServerUnaryReactor* AttentionServiceImpl::Serve(grpc::CallbackServerContext* context,
                                                      const Request* request, Response* response,
                                                      const char* rpc, Decode decode,
                                                      Encode encode) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  // Before anything else, so unauthenticated callers cost nothing but this check.
  if (absl::Status refusal = AuthenticateCall(auth_, *context); !refusal.ok()) {
    Finish(reactor, rpc, start, refusal);
    return reactor;
  }
  metrics_->AddReceivedBytes(static_cast<double>(TensorBytes(*request)));
  if (!AcquireSlot()) {
    Finish(reactor, rpc, start,
           absl::ResourceExhaustedError(absl::StrCat(
               "the server is already serving max_concurrent_requests = ",
               limits_.max_concurrent_requests, " requests; retry later")));
    return reactor;
  }
  // The slot is held until the call is answered, whichever way that happens.
  auto finish = [this, reactor, rpc, start](const absl::Status& status) {
    ReleaseSlot();
    Finish(reactor, rpc, start, status);
  };
  auto inputs = decode(*request);
  if (!inputs.ok()) {
    finish(inputs.status());
    return reactor;
  }
  Job job;
  job.inputs = *std::move(inputs);
  // A client deadline (capped by max_deadline) or cancellation makes the engine drop the job
  // if it has not run yet.
  absl::Time deadline = start + limits_.max_deadline;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(context->deadline()));
  }
  job.control.deadline = deadline;
  job.control.cancelled = [context] { return context->IsCancelled(); };
  // Optional x-attnserve-priority metadata (engine/priority.h); a value it does not know is
  // the caller's mistake, named in the answer.
  if (auto it = context->client_metadata().find(engine::kPriorityMetadataKey);
      it != context->client_metadata().end()) {
    absl::StatusOr<engine::Priority> priority =
        engine::ParsePriority(absl::string_view(it->second.data(), it->second.size()));
    if (!priority.ok()) {
      finish(priority.status());
      return reactor;
    }
    job.control.priority = *priority;
  }
  job.done = [this, response, encode, finish](auto result) {
    if (result.ok()) {
      metrics_->AddSentBytes(static_cast<double>(encode(*std::move(result), response)));
    }
    finish(result.status());
  };
  if (absl::Status status = engine_->Enqueue(std::move(job)); !status.ok()) {
    finish(status);
  }
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Forward(grpc::CallbackServerContext* context,
                                                        const v1::ForwardRequest* request,
                                                        v1::ForwardResponse* response) {
  return Serve<engine::ForwardJob>(context, request, response, "Forward", DecodeForward,
                                   EncodeForward);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Backward(grpc::CallbackServerContext* context,
                                                         const v1::BackwardRequest* request,
                                                         v1::BackwardResponse* response) {
  return Serve<engine::BackwardJob>(context, request, response, "Backward", DecodeBackward,
                                    EncodeBackward);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest*,
    v1::ServerInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  if (absl::Status refusal = AuthenticateCall(auth_, *context); !refusal.ok()) {
    Finish(reactor, "GetServerInfo", start, refusal);
    return reactor;
  }
  *response = BuildServerInfo(*engine_, version_, limits_);
  Finish(reactor, "GetServerInfo", start, absl::OkStatus());
  return reactor;
}

}  // namespace attnserve::transport
