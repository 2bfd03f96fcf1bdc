#include "attnserve/client.h"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
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
    start(&raw->context, raw->request.get(), &raw->response, [raw](grpc::Status status) {
      std::unique_ptr<AsyncCall> owned(raw);
      Client* client = owned->client;
      std::function<void(absl::StatusOr<Response>)> done = std::move(owned->done);
      absl::StatusOr<Response> result =
          status.ok() ? absl::StatusOr<Response>(std::move(owned->response)) : FromGrpc(status);
      owned.reset();
      done(std::move(result));
      done = nullptr;
      client->AsyncCallFinished();
    });
  }
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& target,
                                                        const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target must not be empty");
  grpc::ChannelArguments args;
  if (options.connection_id != 0) {
    // A distinct argument makes gRPC's global subchannel pool keep this channel's connection
    // apart from other channels' to the same target.
    args.SetInt("attnserve.connection_id", options.connection_id);
  }
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", target));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), options));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::AttentionService::NewStub(channel_)),
      options_(std::move(options)) {}

Client::~Client() {
  std::unique_lock<std::mutex> lock(calls_mu_);
  calls_done_.wait(lock, [this] { return calls_in_flight_ == 0; });
}

void Client::AsyncCallStarted() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  ++calls_in_flight_;
}

void Client::AsyncCallFinished() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  if (--calls_in_flight_ == 0) calls_done_.notify_all();
}

void Client::PrepareContext(grpc::ClientContext& context) const {
  if (options_.timeout) context.set_deadline(std::chrono::system_clock::now() + *options_.timeout);
}

absl::StatusOr<v1::ForwardResponse> Client::Forward(const v1::ForwardRequest& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ForwardResponse response;
  if (absl::Status s = FromGrpc(stub_->Forward(&context, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<v1::BackwardResponse> Client::Backward(const v1::BackwardRequest& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::BackwardResponse response;
  if (absl::Status s = FromGrpc(stub_->Backward(&context, request, &response)); !s.ok()) return s;
  return response;
}

void Client::ForwardAsync(const v1::ForwardRequest& request, ForwardCallback done) {
  ForwardAsync(std::make_shared<const v1::ForwardRequest>(request), std::move(done));
}

void Client::ForwardAsync(std::shared_ptr<const v1::ForwardRequest> request, ForwardCallback done) {
  using Call = AsyncCall<v1::ForwardRequest, v1::ForwardResponse>;
  auto call = std::make_unique<Call>();
  call->client = this;
  PrepareContext(call->context);
  call->request = std::move(request);
  call->done = std::move(done);
  Call::Begin(std::move(call), [this](auto&&... args) {
    stub_->async()->Forward(std::forward<decltype(args)>(args)...);
  });
}

void Client::BackwardAsync(const v1::BackwardRequest& request, BackwardCallback done) {
  BackwardAsync(std::make_shared<const v1::BackwardRequest>(request), std::move(done));
}

void Client::BackwardAsync(std::shared_ptr<const v1::BackwardRequest> request,
                           BackwardCallback done) {
  using Call = AsyncCall<v1::BackwardRequest, v1::BackwardResponse>;
  auto call = std::make_unique<Call>();
  call->client = this;
  PrepareContext(call->context);
  call->request = std::move(request);
  call->done = std::move(done);
  Call::Begin(std::move(call), [this](auto&&... args) {
    stub_->async()->Backward(std::forward<decltype(args)>(args)...);
  });
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ServerInfo info;
  if (absl::Status s = FromGrpc(stub_->GetServerInfo(&context, {}, &info)); !s.ok()) return s;
  return info;
}

}  // namespace attnserve
