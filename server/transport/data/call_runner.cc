// Session::Run and Session::Answer: a complete call goes to the engine as the gRPC service
// hands over its calls (deadline capped by max_deadline, cancellation, priority), and its
// answer goes back as a RESPONSE and CHUNKs sent straight from where the engine wrote the
// outputs: over the inputs they replace in the receive buffer (out over q; dq, dk, dv over
// dout, k, v), or in a response buffer (lse; dk and dv of a backward on a context).
#include <algorithm>
#include <utility>

#include "server/transport/data/session.h"
#include "server/transport/grpc/proto_codec.h"

namespace attnserve::transport::data {
namespace {

// One output's bytes: moved out of its message (no copy) when the result owns them, else
// those the engine wrote at `destination`. The message keeps dtype and shape.
ResponseTensor Take(v1::Tensor* tensor, size_t bytes, const char* destination) {
  ResponseTensor taken;
  taken.owned = std::move(*tensor->mutable_data());
  tensor->clear_data();
  if (taken.owned.size() != bytes) {
    taken.at = destination;
    taken.bytes = bytes;
  }
  return taken;
}

int64_t TotalBytes(const std::vector<ResponseTensor>& tensors) {
  int64_t total = 0;
  for (const ResponseTensor& t : tensors) total += static_cast<int64_t>(t.size());
  return total;
}

absl::StatusOr<ResponseParts> ForwardParts(absl::StatusOr<engine::ForwardResult> result,
                                           const engine::OutputSpace& space) {
  if (!result.ok()) return result.status();
  const size_t out_bytes = result->out.size_bytes(), lse_bytes = result->lse.size_bytes();
  ResponseParts parts;
  v1::ForwardResponse* response = parts.message.mutable_forward();
  EncodeForward(*std::move(result), response);
  parts.tensors.push_back(Take(response->mutable_out(), out_bytes, space.at(0)));
  parts.tensors.push_back(Take(response->mutable_lse(), lse_bytes, space.at(1)));
  return parts;
}

absl::StatusOr<ResponseParts> BackwardParts(absl::StatusOr<engine::BackwardResult> result,
                                            const engine::OutputSpace& space) {
  if (!result.ok()) return result.status();
  const size_t dq_bytes = result->dq.size_bytes(), dk_bytes = result->dk.size_bytes(),
               dv_bytes = result->dv.size_bytes();
  ResponseParts parts;
  v1::BackwardResponse* response = parts.message.mutable_backward();
  EncodeBackward(*std::move(result), response);
  parts.tensors.push_back(Take(response->mutable_dq(), dq_bytes, space.at(0)));
  parts.tensors.push_back(Take(response->mutable_dk(), dk_bytes, space.at(1)));
  parts.tensors.push_back(Take(response->mutable_dv(), dv_bytes, space.at(2)));
  return parts;
}

// The call's output space: each output over the received input of its shape, which the engine
// no longer needs once it has read it; lse (which no input matches) in a response buffer.
// A backward on a context receives only dout: its dk and dv, of the context's shapes, go to
// response buffers the engine asks for once it has found the context. Without a response
// buffer an output is left to the engine.
engine::OutputSpace OutputSpaceFor(DataCall& call, engine::HostBuffers& buffers) {
  // The received bytes of tensor `index` (PlannedCall::Slice::tensor), null when not sent.
  auto received = [&call](int index) -> char* {
    for (const PlannedCall::Slice& slice : call.plan.slices) {
      if (slice.tensor == index) return call.buffer->data() + slice.offset;
    }
    return nullptr;
  };
  engine::OutputSpace space;
  if (call.plan.backward()) {
    // Backward fields in order: dout, q, k, v, out, lse.
    space.destinations = {received(0), received(2), received(3)};
    if (space.destinations[1] == nullptr) {
      // Called during Enqueue, while the call is alive and no chunk writer reads these fields.
      space.allocate = [&call, &buffers](size_t output, size_t bytes) -> char* {
        call.context_k_bytes = bytes;
        absl::StatusOr<std::unique_ptr<engine::HostBuffer>> buffer = buffers.Allocate(bytes);
        if (!buffer.ok()) return nullptr;
        std::unique_ptr<engine::HostBuffer>& kept = call.context_outputs[output - 1];
        kept = *std::move(buffer);
        call.outputs.destinations[output] = kept->data();
        return kept->data();
      };
    }
    return space;
  }
  const engine::ForwardInputs& forward = std::get<engine::ForwardInputs>(call.plan.inputs);
  const size_t lse_bytes = sizeof(float) * static_cast<size_t>(forward.q.shape[0]) *
                           static_cast<size_t>(forward.q.shape[1]);
  absl::StatusOr<std::unique_ptr<engine::HostBuffer>> lse = buffers.Allocate(lse_bytes);
  char* lse_at = nullptr;
  if (lse.ok()) {
    call.response_buffer = *std::move(lse);
    lse_at = call.response_buffer->data();
  }
  space.destinations = {received(0), lse_at};
  return space;
}

// Output rows of one group, at their destination, and where they go in the response payload.
struct StreamedRows {
  const char* data;
  uint64_t offset;
  uint64_t bytes;
};

// Group `group`'s rows of the outputs the engine wrote at their destinations, which go back as
// soon as the group is done (the rest comes with the RESPONSE): a forward's out rows (lse is
// small and spread over every head), a backward's dq, dk and dv rows.
std::vector<StreamedRows> GroupOutputs(const DataCall& call, int group) {
  const engine::SequenceGroups& groups = *call.groups;
  const int32_t b0 = groups.first_sequence(group), b1 = groups.end_sequence(group);
  std::vector<StreamedRows> rows;
  uint64_t response_offset = 0;
  // Output `index` of `bytes`, whose rows (cu.back() in all) of the group are [cu[b0], cu[b1]).
  auto add = [&](size_t index, size_t bytes, const std::vector<int32_t>& cu) {
    const uint64_t row = bytes / std::max<int32_t>(1, cu.back());
    const char* destination = call.outputs.at(index);
    const uint64_t begin = row * cu[b0], end = row * cu[b1];
    if (destination != nullptr && end > begin) {
      rows.push_back({destination + begin, response_offset + begin, end - begin});
    }
    response_offset += bytes;
  };
  if (const auto* f = std::get_if<engine::ForwardInputs>(&call.plan.inputs)) {
    add(0, f->q.size_bytes, f->cu_seqlens_q);
    return rows;
  }
  const auto& b = std::get<engine::BackwardInputs>(call.plan.inputs);
  // On a context, dk and dv are shaped like its k (the engine's word, context_k_bytes).
  const size_t k_bytes = b.k.absent() ? call.context_k_bytes : b.k.size_bytes;
  add(0, b.dout.size_bytes, b.cu_seqlens_q);
  add(1, k_bytes, b.cu_seqlens_k);
  add(2, k_bytes, b.cu_seqlens_k);
  return rows;
}

// Of the engine's time [ran, answered], the seconds while the payload still arrived (until
// `arrived`) or answer bytes were going back (from `first_streamed`): the union's length.
double OverlapSeconds(absl::Time ran, absl::Time arrived, absl::Time first_streamed,
                      absl::Time answered) {
  const absl::Time receiving_end = std::min(arrived, answered);
  const absl::Duration receiving = std::max(absl::ZeroDuration(), receiving_end - ran);
  const absl::Time sending_start = std::max(first_streamed, receiving_end);
  const absl::Duration sending = std::max(absl::ZeroDuration(), answered - sending_start);
  return absl::ToDoubleSeconds(receiving + sending);
}

}  // namespace

absl::Time Session::Deadline(const DataCall& call) const {
  // timeout_ms counts from the REQUEST, as a gRPC deadline counts from the call's start.
  return call.start + std::min(context_->options.max_deadline, call.plan.timeout);
}

void Session::Run(const std::shared_ptr<DataCall>& call) {
  const absl::Time now = absl::Now();
  call->ran = now;  // read by Answer, which the engine runs after this
  context_->metrics->AddReceivedBytes(static_cast<double>(call->plan.payload_bytes));
  context_->data_metrics->RecordTransfer("in", absl::ToDoubleSeconds(now - call->start));
  engine::JobControl control;
  control.deadline = Deadline(*call);
  control.cancelled = [cancelled = call->cancelled] { return cancelled->load(); };
  control.priority = call->plan.priority;
  control.principal = principal_;
  std::shared_ptr<Session> self = shared_from_this();
  call->outputs = OutputSpaceFor(*call, context_->engine->host_buffers());
  absl::Status enqueued;
  if (call->plan.backward()) {
    engine::BackwardJob job;
    job.inputs = std::get<engine::BackwardInputs>(call->plan.inputs);
    job.inputs.output_space = call->outputs;
    job.inputs.groups = call->groups;
    job.control = std::move(control);
    job.done = [self, call](absl::StatusOr<engine::BackwardResult> result) {
      self->Answer(call, BackwardParts(std::move(result), call->outputs));
    };
    enqueued = context_->engine->Enqueue(std::move(job));
  } else {
    engine::ForwardJob job;
    job.inputs = std::get<engine::ForwardInputs>(call->plan.inputs);
    job.inputs.output_space = call->outputs;
    job.inputs.groups = call->groups;
    job.control = std::move(control);
    job.done = [self, call](absl::StatusOr<engine::ForwardResult> result) {
      self->Answer(call, ForwardParts(std::move(result), call->outputs));
    };
    enqueued = context_->engine->Enqueue(std::move(job));
  }
  if (!enqueued.ok()) Answer(call, enqueued);
}

void Session::SendGroup(const std::shared_ptr<DataCall>& call, int group) {
  const std::vector<StreamedRows> outputs = GroupOutputs(*call, group);
  if (outputs.empty()) return;
  std::vector<OutFrame> frames;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(call->id);
    if (it == calls_.end() || it->second != call || call->cancelled->load()) return;
    if (call->streamed == nullptr) {
      call->streamed = std::make_shared<OutboundResponse>();
      call->streamed->memory = call;
      call->streamed->queued = absl::Now();
      call->streamed->metrics = context_->data_metrics;
      call->first_streamed = call->streamed->queued;
    }
    for (const StreamedRows& rows : outputs) {
      call->streamed_ranges.emplace_back(rows.offset, rows.offset + rows.bytes);
      AppendChunkFrames(call->id, call->streamed, rows.data, rows.offset, rows.bytes,
                        context_->options.response_chunk_bytes, &frames);
      bytes += rows.bytes;
    }
  }
  context_->metrics->AddSentBytes(static_cast<double>(bytes));
  Send(std::move(frames));
}

void Session::Answer(const std::shared_ptr<DataCall>& call, absl::StatusOr<ResponseParts> parts) {
  std::shared_ptr<OutboundResponse> streamed;
  std::vector<std::pair<uint64_t, uint64_t>> sent;
  absl::Time ran, arrived, first_streamed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streamed = std::move(call->streamed);
    sent = std::move(call->streamed_ranges);
    ran = call->ran;
    arrived = call->arrived;
    first_streamed = call->first_streamed;
  }
  // ResponseFrames skips them in payload order; a backward's groups sent dq, dk, dv rows.
  std::sort(sent.begin(), sent.end());
  const absl::Time answered = absl::Now();
  if (parts.ok() && ran < answered) {
    context_->data_metrics->RecordOverlap(OverlapSeconds(ran, arrived, first_streamed, answered),
                                          absl::ToDoubleSeconds(answered - ran));
  }
  const absl::Status status = parts.ok() ? absl::OkStatus() : parts.status();
  context_->metrics->RecordRequest(call->rpc, absl::StatusCodeToString(status.code()),
                                   absl::ToDoubleSeconds(absl::Now() - call->start));
  context_->data_metrics->RecordRequest(call->rpc, absl::StatusCodeToString(status.code()));
  // Cancelled, or the session ended: nobody waits for the answer (its slot goes with `call`,
  // and so do its buffers, once no connection writes a chunk of a grouped call into them).
  // A grouped call may be answered (a failure) while chunks are still on their way.
  if (!Forget(call, /*tombstone=*/call->group_tracker.has_value()) || call->cancelled->load()) {
    return;
  }
  if (!parts.ok()) {
    Send({StatusResponseFrame(call->id, status)});
    return;
  }
  // A grouped call whose first groups went out already: its response carries on.
  std::shared_ptr<OutboundResponse> response =
      streamed != nullptr ? std::move(streamed) : std::make_shared<OutboundResponse>();
  response->lease = std::move(call->lease);
  response->tensors = std::move(parts->tensors);
  // The outputs the engine wrote into the call's buffers are sent from there: the buffers (and
  // their share of the budget) go when the last frame has been sent or dropped.
  response->memory = call;
  if (sent.empty()) response->queued = absl::Now();
  response->metrics = context_->data_metrics;
  const int64_t payload = TotalBytes(response->tensors);
  int64_t streamed_bytes = 0;
  for (const auto& [begin, end] : sent) streamed_bytes += static_cast<int64_t>(end - begin);
  parts->message.set_payload_bytes(payload);
  context_->metrics->AddSentBytes(static_cast<double>(payload - streamed_bytes));
  Send(ResponseFrames(call->id, parts->message, std::move(response),
                      context_->options.response_chunk_bytes, sent));
}

}  // namespace attnserve::transport::data
