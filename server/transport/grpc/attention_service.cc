#include "server/transport/grpc/attention_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "server/engine/error_text.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "server/transport/grpc/answer_reactor.h"
#include "server/transport/grpc/answer_size.h"
#include "server/transport/grpc/call_auth.h"
#include "server/transport/grpc/call_control.h"
#include "server/transport/grpc/proto_codec.h"
#include "server/transport/server_info.h"

namespace attnserve::transport {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      engine::BoundedErrorMessage(status.message()));
}

AttentionServiceImpl::AttentionServiceImpl(engine::Engine* engine,
                                           metrics::ServerMetrics* metrics, std::string version,
                                           CallLimits limits, CallSlots* slots,
                                           const Authenticator* auth,
                                           std::string advertise_address)
    : engine_(engine),
      metrics_(metrics),
      version_(std::move(version)),
      limits_(limits),
      slots_(slots),
      auth_(auth),
      advertise_address_(std::move(advertise_address)) {}

void AttentionServiceImpl::Finish(grpc::ServerUnaryReactor* reactor, const char* rpc,
                                  absl::Time start, const absl::Status& status) {
  metrics_->RecordRequest(rpc, absl::StatusCodeToString(status.code()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  reactor->Finish(ToGrpcStatus(status));
}

void AttentionServiceImpl::Finish(AnswerReactor* reactor, const char* rpc, absl::Time start,
                                  const absl::Status& status) {
  metrics_->RecordRequest(rpc, absl::StatusCodeToString(status.code()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  reactor->FinishCall(ToGrpcStatus(status));
}

namespace {

// One call's messages. The engine reads the request's tensors in place, so it lives until the
// job is done, held by the job's completion.
template <typename Request, typename Response>
struct CallMessages {
  Request request;
  Response response;
};

// The request parsed from its bytes; INVALID_ARGUMENT naming the message type otherwise.
template <typename Request>
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, Request* request) {
  grpc::ByteBuffer shared(bytes);  // shares the slices; Deserialize consumes its argument
  if (!grpc::SerializationTraits<Request>::Deserialize(&shared, request).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not a valid ", Request::descriptor()->full_name(),
                     " protobuf message"));
  }
  return absl::OkStatus();
}

}  // namespace

// Forward and Backward share this flow: parse, decode, enqueue, and let the worker's
// completion encode and serialize the result and finish the call.
template <typename Job, typename Request, typename Response, typename Decode, typename Encode>
grpc::ServerUnaryReactor* AttentionServiceImpl::Serve(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request_bytes,
                                                      grpc::ByteBuffer* response_bytes,
                                                      const char* rpc, Decode decode,
                                                      Encode encode) {
  auto* reactor = new AnswerReactor(context, slots_, limits_.answer_send_timeout);
  const absl::Time start = absl::Now();
  // Before anything else, so unauthenticated callers cost nothing but this check.
  if (absl::Status refusal = AuthenticateCall(auth_, *context); !refusal.ok()) {
    Finish(reactor, rpc, start, refusal);
    return reactor;
  }
  // No message arrived: the transport already ended the call (the client cancelled, or the
  // message broke a limit such as max_message_bytes, which gRPC answers itself). gRPC still
  // runs a raw handler then; the call is closed without counting it, as a typed handler
  // would never have seen it.
  if (!request_bytes->Valid()) {
    reactor->FinishCall(grpc::Status(grpc::StatusCode::CANCELLED, "no request message arrived"));
    return reactor;
  }
  auto messages = std::make_shared<CallMessages<Request, Response>>();
  if (absl::Status parsed = ParseRequest(*request_bytes, &messages->request); !parsed.ok()) {
    Finish(reactor, rpc, start, parsed);
    return reactor;
  }
  const Request& request = messages->request;
  metrics_->AddReceivedBytes(static_cast<double>(TensorBytes(request)));
  // The slot is held until the answer has been written out or the call cancelled (OnDone).
  if (absl::Status slot = reactor->AcquireSlot(); !slot.ok()) {
    Finish(reactor, rpc, start, slot);
    return reactor;
  }
  auto finish = [this, reactor, rpc, start](const absl::Status& status) {
    Finish(reactor, rpc, start, status);
  };
  auto inputs = decode(request);
  if (!inputs.ok()) {
    finish(inputs.status());
    return reactor;
  }
  if (absl::Status fits = CheckAnswerFits(*inputs, engine_->limits().max_message_bytes);
      !fits.ok()) {
    finish(fits);
    return reactor;
  }
  Job job;
  job.inputs = *std::move(inputs);
  absl::StatusOr<engine::JobControl> control =
      CallControl(context, auth_, start, limits_.max_deadline);
  if (!control.ok()) {
    finish(control.status());
    return reactor;
  }
  job.control = *std::move(control);
  job.done = [this, messages, response_bytes, encode, finish](auto result) {
    if (!result.ok()) {
      finish(result.status());
      return;
    }
    const int64_t sent = encode(*std::move(result), &messages->response);
    bool own_buffer = false;
    if (!grpc::SerializationTraits<Response>::Serialize(messages->response, response_bytes,
                                                        &own_buffer)
             .ok()) {
      finish(absl::InternalError(absl::StrCat("could not serialize the ",
                                              Response::descriptor()->full_name())));
      return;
    }
    metrics_->AddSentBytes(static_cast<double>(sent));
    finish(absl::OkStatus());
  };
  if (absl::Status status = engine_->Enqueue(std::move(job)); !status.ok()) {
    finish(status);
  }
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Forward(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Serve<engine::ForwardJob, v1::ForwardRequest, v1::ForwardResponse>(
      context, request, response, "Forward", DecodeForward,
      [this](engine::ForwardResult result, v1::ForwardResponse* out) {
        const bool kept = !result.context_id.empty();
        const int64_t sent = EncodeForward(std::move(result), out);
        if (kept) out->set_context_address(advertise_address_);
        return sent;
      });
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Backward(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Serve<engine::BackwardJob, v1::BackwardRequest, v1::BackwardResponse>(
      context, request, response, "Backward", DecodeBackward, EncodeBackward);
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
  response->set_address(advertise_address_);
  Finish(reactor, "GetServerInfo", start, absl::OkStatus());
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ReleaseContext(
    grpc::CallbackServerContext* context, const v1::ReleaseContextRequest* request,
    v1::ReleaseContextResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  if (absl::Status refusal = AuthenticateCall(auth_, *context); !refusal.ok()) {
    Finish(reactor, "ReleaseContext", start, refusal);
    return reactor;
  }
  if (request->context_id().empty()) {
    Finish(reactor, "ReleaseContext", start,
           absl::InvalidArgumentError("context_id: must not be empty"));
    return reactor;
  }
  response->set_released(
      engine_->ReleaseContext(request->context_id(), CallPrincipal(auth_, *context)));
  Finish(reactor, "ReleaseContext", start, absl::OkStatus());
  return reactor;
}

}  // namespace attnserve::transport
