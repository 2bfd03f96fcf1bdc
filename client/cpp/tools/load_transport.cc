#include "tools/load_transport.h"

#include <atomic>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/cpp/src/call_workers.h"
#include "tools/data_calls.h"

namespace attnserve::load {
namespace {

using tools::AnswerBuffers;

absl::Status NoCheck() { return absl::OkStatus(); }

class GrpcTransport : public LoadTransport {
 public:
  GrpcTransport(const std::vector<std::unique_ptr<Client>>& clients, bool keep_context,
                bool shared_memory)
      : clients_(clients), keep_context_(keep_context), shared_memory_(shared_memory) {}

  void Forward(const WorkItem& item, Done done) override {
    Next().ForwardAsync(item.forward, [&item, done](absl::StatusOr<v1::ForwardResponse> r) {
      done(r.status(), tools::ForwardPayloadBytes(*item.forward),
           [&] { return VerifyForward(item, *r); });
    });
  }

  void Backward(const WorkItem& item, Done done) override {
    Client& client = Next();
    if (!keep_context_) return Full(client, item, 0, std::move(done));
    client.ForwardAsync(item.forward, [this, &client, &item,
                                       done](absl::StatusOr<v1::ForwardResponse> forward) {
      if (!forward.ok()) return done(forward.status(), 0, NoCheck);
      const int64_t forward_bytes = tools::ForwardPayloadBytes(*item.forward);
      if (forward->context_id().empty()) return Full(client, item, forward_bytes, done);
      // The context's backward carries dout only; copying it into the request costs what
      // gRPC's own serialization does again, and is part of what a gRPC caller pays.
      auto request = std::make_shared<v1::BackwardRequest>();
      *request->mutable_dout() = item.backward->dout();
      request->set_context_id(forward->context_id());
      client.BackwardAsync(request, [this, &client, &item, done, forward_bytes](
                                        absl::StatusOr<v1::BackwardResponse> r) {
        if (r.status().code() == absl::StatusCode::kNotFound) {
          return Full(client, item, forward_bytes, done);
        }
        const int64_t bytes =
            forward_bytes + tools::ContextBackwardPayloadBytes(*item.forward, item.backward->dout());
        done(r.status(), bytes, [&] { return VerifyBackward(item, *r); });
      });
    });
  }

  std::string Describe() const override {
    if (shared_memory_) return absl::StrCat("shared memory (", clients_.size(), " client(s))");
    return absl::StrCat("grpc (", clients_.size(), " connection(s))");
  }
  std::string Name() const override { return shared_memory_ ? "shm" : "grpc"; }

 private:
  Client& Next() { return *clients_[next_++ % clients_.size()]; }

  // The backward sent in full; `extra_bytes` moved before it in the same step.
  void Full(Client& client, const WorkItem& item, int64_t extra_bytes, Done done) {
    client.BackwardAsync(item.backward, [&item, done,
                                         extra_bytes](absl::StatusOr<v1::BackwardResponse> r) {
      done(r.status(), extra_bytes + tools::BackwardPayloadBytes(*item.backward),
           [&] { return VerifyBackward(item, *r); });
    });
  }

  const std::vector<std::unique_ptr<Client>>& clients_;
  const bool keep_context_;
  const bool shared_memory_;
  std::atomic<uint64_t> next_{0};
};

class DataTransport : public LoadTransport {
 public:
  DataTransport(std::unique_ptr<DataChannelClient> client, bool keep_context)
      : client_(std::move(client)), keep_context_(keep_context) {}

  void Forward(const WorkItem& item, Done done) override {
    Submit([this, &item, done](AnswerBuffers& answer) {
      absl::StatusOr<v1::DataResponse> r =
          tools::DataForward(*client_, *item.forward, /*keep_context=*/false, answer);
      done(r.status(), tools::ForwardPayloadBytes(*item.forward),
           [&] { return VerifyForward(item, tools::ToForwardResponse(*r, answer)); });
    });
  }

  void Backward(const WorkItem& item, Done done) override {
    Submit([this, &item, done](AnswerBuffers& answer) {
      int64_t bytes = 0;
      absl::StatusOr<v1::DataResponse> r =
          keep_context_ ? Step(item, answer, bytes) : Full(item, answer, bytes);
      done(r.status(), bytes,
           [&] { return VerifyBackward(item, tools::ToBackwardResponse(*r, answer)); });
    });
  }

  std::string Describe() const override {
    return absl::StrCat("data channel (", client_->connections(), " connection(s))");
  }
  std::string Name() const override { return "data"; }

 private:
  using Task = std::function<void(AnswerBuffers&)>;

  absl::StatusOr<v1::DataResponse> Full(const WorkItem& item, AnswerBuffers& answer,
                                        int64_t& bytes) {
    bytes += tools::BackwardPayloadBytes(*item.backward);
    return tools::DataBackward(*client_, *item.backward, answer);
  }

  // Forward keeping the context, then the backward on it (in full when it is gone).
  absl::StatusOr<v1::DataResponse> Step(const WorkItem& item, AnswerBuffers& answer,
                                        int64_t& bytes) {
    absl::StatusOr<v1::DataResponse> forward =
        tools::DataForward(*client_, *item.forward, /*keep_context=*/true, answer);
    if (!forward.ok()) return forward;
    bytes += tools::ForwardPayloadBytes(*item.forward);
    const std::string& id = forward->forward().context_id();
    if (!id.empty()) {
      absl::StatusOr<v1::DataResponse> r = tools::DataBackwardOnContext(
          *client_, *item.forward, id, item.backward->dout(), answer);
      if (r.status().code() != absl::StatusCode::kNotFound) {
        bytes += tools::ContextBackwardPayloadBytes(*item.forward, item.backward->dout());
        return r;
      }
    }
    return Full(item, answer, bytes);
  }

  // A call runs on a free worker or a new one (workers never outnumber the most calls in
  // flight at once); each worker thread keeps its answer buffers from call to call.
  void Submit(Task task) {
    workers_.Submit([task = std::move(task)] {
      thread_local AnswerBuffers answer;
      task(answer);
    });
  }

  const std::unique_ptr<DataChannelClient> client_;
  const bool keep_context_;
  // Last: its destruction finishes the calls, which use the client.
  internal::CallWorkers workers_{std::numeric_limits<size_t>::max()};
};

}  // namespace

std::unique_ptr<LoadTransport> MakeGrpcTransport(
    const std::vector<std::unique_ptr<Client>>& clients, bool keep_context,
    bool shared_memory) {
  return std::make_unique<GrpcTransport>(clients, keep_context, shared_memory);
}

absl::StatusOr<std::unique_ptr<LoadTransport>> OpenDataTransport(
    const DataChannelOptions& options, bool keep_context) {
  absl::StatusOr<std::unique_ptr<DataChannelClient>> client = DataChannelClient::Open(options);
  if (!client.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot open the data channel at ", options.host,
                                               ":", options.port, ": ",
                                               client.status().ToString()));
  }
  return std::make_unique<DataTransport>(*std::move(client), keep_context);
}

}  // namespace attnserve::load
