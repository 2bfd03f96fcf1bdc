// attnserve::Client's asynchronous calls: gRPC's own asynchronous calls when the transport is
// gRPC for good, else the synchronous call (shared memory, data channel or gRPC, as it decides)
// on one of the Client's worker threads (call_workers.h), since those calls block.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <future>
#include <memory>
#include <utility>

#include "attnserve/client.h"
#include "client/cpp/src/call_workers.h"
#include "client/cpp/src/data_path.h"
#include "client/cpp/src/grpc_status.h"
#include "client/cpp/src/shared_memory_route.h"
#include "common/grpc_tsan_handoff.h"

namespace attnserve {
namespace {

// A callback that fulfils a promise, and the promise's future.
template <typename Response>
std::pair<std::function<void(absl::StatusOr<Response>)>, std::future<absl::StatusOr<Response>>>
Promised() {
  auto promise = std::make_shared<std::promise<absl::StatusOr<Response>>>();
  std::future<absl::StatusOr<Response>> future = promise->get_future();
  return {[promise](absl::StatusOr<Response> result) { promise->set_value(std::move(result)); },
          std::move(future)};
}

}  // namespace

// Everything one asynchronous call needs until gRPC reports its end: gRPC reads the request
// and writes the response through pointers, and the context must outlive the call.
template <typename Request, typename Response>
struct AsyncCall {
  Client* client = nullptr;
  grpc::ClientContext context;
  std::shared_ptr<const Request> request;
  Response response;
  std::function<void(absl::StatusOr<Response>)> done;

  // Starts the call with `start(context, request, response, on_end)`. The call's state is
  // freed before `done` runs, so `done` may start new calls freely; the Client hears of the
  // end only after `done` returns.
  template <typename Start>
  static void Begin(std::unique_ptr<AsyncCall> call, Start start) {
    call->client->AsyncCallStarted();
    AsyncCall* raw = call.release();
    HandOffToGrpc(raw);
    start(&raw->context, raw->request.get(), &raw->response, [raw](grpc::Status status) {
      TakeBackFromGrpc(raw);
      std::unique_ptr<AsyncCall> owned(raw);
      Client* client = owned->client;
      std::function<void(absl::StatusOr<Response>)> done = std::move(owned->done);
      absl::StatusOr<Response> result = status.ok()
                                            ? absl::StatusOr<Response>(std::move(owned->response))
                                            : internal::FromGrpc(status);
      owned.reset();
      done(std::move(result));
      done = nullptr;
      client->AsyncCallFinished();
    });
  }

  // Starts `request`: on a worker as the synchronous `sync(request)` when `on_worker`, else
  // as gRPC's own asynchronous call `start(context, request, response, on_end)`.
  template <typename Sync, typename Start>
  static void Launch(Client* client, std::shared_ptr<const Request> request,
                     std::function<void(absl::StatusOr<Response>)> done, bool on_worker,
                     Sync sync, Start start) {
    if (on_worker) {
      return client->RunOnWorker(
          [request = std::move(request), done = std::move(done), sync]() mutable {
            absl::StatusOr<Response> result = sync(*request);
            request.reset();
            done(std::move(result));
          });
    }
    auto call = std::make_unique<AsyncCall>();
    call->client = client;
    client->PrepareContext(call->context);
    call->request = std::move(request);
    call->done = std::move(done);
    Begin(std::move(call), start);
  }
};

bool Client::AsyncOverGrpc() {
  // Calls through shared memory block, as the data channel's do.
  return shared_memory_->OffForGood() &&
         (options_.transport == Transport::kGrpc || data_->GrpcForGood());
}

void Client::RunOnWorker(std::function<void()> work) {
  AsyncCallStarted();
  workers_->Submit([this, work = std::move(work)]() mutable {
    work();
    work = nullptr;  // what the call held goes before the Client hears of its end
    AsyncCallFinished();
  });
}

void Client::ForwardAsync(const v1::ForwardRequest& request, ForwardCallback done) {
  ForwardAsync(std::make_shared<const v1::ForwardRequest>(request), std::move(done));
}

void Client::ForwardAsync(std::shared_ptr<const v1::ForwardRequest> request, ForwardCallback done) {
  const bool on_worker = !AsyncOverGrpc() && internal::FitsDataChannel(*request);
  AsyncCall<v1::ForwardRequest, v1::ForwardResponse>::Launch(
      this, std::move(request), std::move(done), on_worker,
      [this](const v1::ForwardRequest& r) { return Forward(r); },
      [this](auto&&... args) { stub_->async()->Forward(std::forward<decltype(args)>(args)...); });
}

void Client::BackwardAsync(const v1::BackwardRequest& request, BackwardCallback done) {
  BackwardAsync(std::make_shared<const v1::BackwardRequest>(request), std::move(done));
}

void Client::BackwardAsync(std::shared_ptr<const v1::BackwardRequest> request,
                           BackwardCallback done) {
  const bool on_worker = !AsyncOverGrpc() && internal::FitsDataChannel(*request);
  AsyncCall<v1::BackwardRequest, v1::BackwardResponse>::Launch(
      this, std::move(request), std::move(done), on_worker,
      [this](const v1::BackwardRequest& r) { return Backward(r); },
      [this](auto&&... args) { stub_->async()->Backward(std::forward<decltype(args)>(args)...); });
}

void Client::BackwardOnContextAsync(std::shared_ptr<const v1::ForwardRequest> forward,
                                    std::shared_ptr<const v1::ForwardResponse> answer,
                                    std::shared_ptr<const v1::Tensor> dout,
                                    const ContextBackwardOptions& options, BackwardCallback done) {
  // Its steps (the dout-only backward, the resend in full) are sequential, so the whole runs
  // on a worker whichever the transport.
  RunOnWorker([this, forward = std::move(forward), answer = std::move(answer),
               dout = std::move(dout), options, done = std::move(done)]() mutable {
    absl::StatusOr<v1::BackwardResponse> result =
        BackwardOnContext(*forward, *answer, *dout, options);
    forward.reset();
    answer.reset();
    dout.reset();
    done(std::move(result));
  });
}

std::future<absl::StatusOr<v1::ForwardResponse>> Client::ForwardFuture(
    std::shared_ptr<const v1::ForwardRequest> request) {
  auto [done, future] = Promised<v1::ForwardResponse>();
  ForwardAsync(std::move(request), std::move(done));
  return std::move(future);
}

std::future<absl::StatusOr<v1::BackwardResponse>> Client::BackwardFuture(
    std::shared_ptr<const v1::BackwardRequest> request) {
  auto [done, future] = Promised<v1::BackwardResponse>();
  BackwardAsync(std::move(request), std::move(done));
  return std::move(future);
}

std::future<absl::StatusOr<v1::BackwardResponse>> Client::BackwardOnContextFuture(
    std::shared_ptr<const v1::ForwardRequest> forward,
    std::shared_ptr<const v1::ForwardResponse> answer, std::shared_ptr<const v1::Tensor> dout,
    const ContextBackwardOptions& options) {
  auto [done, future] = Promised<v1::BackwardResponse>();
  BackwardOnContextAsync(std::move(forward), std::move(answer), std::move(dout), options,
                         std::move(done));
  return std::move(future);
}

}  // namespace attnserve
