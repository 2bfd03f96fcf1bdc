#include "tools/load_transport.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tools/data_calls.h"

namespace attnserve::load {
namespace {

using tools::AnswerBuffers;

absl::Status NoCheck() { return absl::OkStatus(); }

class GrpcTransport : public LoadTransport {
 public:
  GrpcTransport(const std::vector<std::unique_ptr<Client>>& clients, bool keep_context)
      : clients_(clients), keep_context_(keep_context) {}

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
    return absl::StrCat("grpc (", clients_.size(), " connection(s))");
  }
  std::string Name() const override { return "grpc"; }

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
  std::atomic<uint64_t> next_{0};
};

class DataTransport : public LoadTransport {
 public:
  DataTransport(std::unique_ptr<DataChannelClient> client, bool keep_context)
      : client_(std::move(client)), keep_context_(keep_context) {}

  ~DataTransport() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

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

  // A call waits for a free worker or gets a new one: workers never outnumber the most calls
  // in flight at once, and each keeps its answer buffers from call to call.
  void Submit(Task task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (tasks_.size() > idle_) {
      workers_.emplace_back([this] { Work(); });
    } else {
      cv_.notify_one();
    }
  }

  void Work() {
    AnswerBuffers answer;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task(answer);
      lock.lock();
    }
  }

  const std::unique_ptr<DataChannelClient> client_;
  const bool keep_context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<LoadTransport> MakeGrpcTransport(
    const std::vector<std::unique_ptr<Client>>& clients, bool keep_context) {
  return std::make_unique<GrpcTransport>(clients, keep_context);
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
