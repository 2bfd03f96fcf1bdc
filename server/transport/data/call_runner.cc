// Session::Run and Session::Answer: a complete call goes to the engine as the gRPC service
// hands over its calls (deadline capped by max_deadline, cancellation, priority), and its
// answer goes back as a RESPONSE and CHUNKs of the result's own bytes.
#include <algorithm>
#include <utility>

#include "server/transport/data/session.h"
#include "server/transport/grpc/proto_codec.h"

namespace attnserve::transport::data {
namespace {

// Moves a result tensor's bytes out of its message (no copy): the message keeps dtype and
// shape, the CHUNKs carry the bytes.
std::string TakeData(v1::Tensor* tensor) {
  std::string data = std::move(*tensor->mutable_data());
  tensor->clear_data();
  return data;
}

int64_t TotalBytes(const std::vector<std::string>& tensors) {
  int64_t total = 0;
  for (const std::string& t : tensors) total += static_cast<int64_t>(t.size());
  return total;
}

absl::StatusOr<ResponseParts> ForwardParts(absl::StatusOr<engine::ForwardResult> result) {
  if (!result.ok()) return result.status();
  ResponseParts parts;
  v1::ForwardResponse* response = parts.message.mutable_forward();
  EncodeForward(*std::move(result), response);
  parts.tensors.push_back(TakeData(response->mutable_out()));
  parts.tensors.push_back(TakeData(response->mutable_lse()));
  return parts;
}

absl::StatusOr<ResponseParts> BackwardParts(absl::StatusOr<engine::BackwardResult> result) {
  if (!result.ok()) return result.status();
  ResponseParts parts;
  v1::BackwardResponse* response = parts.message.mutable_backward();
  EncodeBackward(*std::move(result), response);
  parts.tensors.push_back(TakeData(response->mutable_dq()));
  parts.tensors.push_back(TakeData(response->mutable_dk()));
  parts.tensors.push_back(TakeData(response->mutable_dv()));
  return parts;
}

}  // namespace

void Session::Run(const std::shared_ptr<DataCall>& call) {
  const absl::Time now = absl::Now();
  context_->metrics->AddReceivedBytes(static_cast<double>(call->plan.payload_bytes));
  context_->data_metrics->RecordTransfer("in", absl::ToDoubleSeconds(now - call->start));
  engine::JobControl control;
  // timeout_ms counts from the REQUEST, as a gRPC deadline counts from the call's start.
  control.deadline = call->start + std::min(context_->options.max_deadline, call->plan.timeout);
  control.cancelled = [cancelled = call->cancelled] { return cancelled->load(); };
  control.priority = call->plan.priority;
  control.principal = principal_;
  std::shared_ptr<Session> self = shared_from_this();
  absl::Status enqueued;
  if (call->plan.backward()) {
    engine::BackwardJob job;
    job.inputs = std::get<engine::BackwardInputs>(call->plan.inputs);
    job.control = std::move(control);
    job.done = [self, call](absl::StatusOr<engine::BackwardResult> result) {
      self->Answer(call, BackwardParts(std::move(result)));
    };
    enqueued = context_->engine->Enqueue(std::move(job));
  } else {
    engine::ForwardJob job;
    job.inputs = std::get<engine::ForwardInputs>(call->plan.inputs);
    job.control = std::move(control);
    job.done = [self, call](absl::StatusOr<engine::ForwardResult> result) {
      self->Answer(call, ForwardParts(std::move(result)));
    };
    enqueued = context_->engine->Enqueue(std::move(job));
  }
  if (!enqueued.ok()) Answer(call, enqueued);
}

void Session::Answer(const std::shared_ptr<DataCall>& call, absl::StatusOr<ResponseParts> parts) {
  const absl::Status status = parts.ok() ? absl::OkStatus() : parts.status();
  context_->metrics->RecordRequest(call->rpc, absl::StatusCodeToString(status.code()),
                                   absl::ToDoubleSeconds(absl::Now() - call->start));
  call->ReleaseBuffer();
  // Cancelled, or the session ended: nobody waits for the answer (its slot goes with `call`).
  if (!Forget(call, /*tombstone=*/false) || call->cancelled->load()) return;
  if (!parts.ok()) {
    Send({StatusResponseFrame(call->id, status)});
    return;
  }
  auto response = std::make_shared<OutboundResponse>();
  response->lease = std::move(call->lease);
  response->tensors = std::move(parts->tensors);
  response->queued = absl::Now();
  response->metrics = context_->data_metrics;
  const int64_t payload = TotalBytes(response->tensors);
  parts->message.set_payload_bytes(payload);
  context_->metrics->AddSentBytes(static_cast<double>(payload));
  Send(ResponseFrames(call->id, parts->message, std::move(response),
                      context_->options.response_chunk_bytes));
}

}  // namespace attnserve::transport::data
