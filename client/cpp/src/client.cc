#include "attnserve/client.h"

#include <grpcpp/grpcpp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_tsan_handoff.h"

namespace attnserve {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the ", what, " ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  if (tls.certificate_chain_file.empty() != tls.private_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its private key and the other way round");
  }
  grpc::SslCredentialsOptions options;
  const std::pair<const char*, const std::string*> files[] = {
      {"TLS CA file", &tls.root_certificates_file},
      {"TLS certificate file", &tls.certificate_chain_file},
      {"TLS key file", &tls.private_key_file}};
  std::string* contents[] = {&options.pem_root_certs, &options.pem_cert_chain,
                             &options.pem_private_key};
  for (int i = 0; i < 3; ++i) {
    if (files[i].second->empty()) continue;
    absl::StatusOr<std::string> pem = ReadFile(files[i].first, *files[i].second);
    if (!pem.ok()) return pem.status();
    *contents[i] = *std::move(pem);
  }
  return grpc::SslCredentials(options);
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile("token file", path);
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line.front() != '#') return std::string(line);
  }
  return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " holds no token"));
}

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
  if (options.tls.enabled && !options.tls.server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls.server_name);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, *credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", target));
  }
  return std::unique_ptr<Client>(
      new Client(std::move(channel), options, *std::move(credentials), std::move(args)));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options,
               std::shared_ptr<grpc::ChannelCredentials> credentials,
               grpc::ChannelArguments args)
    : channel_(std::move(channel)),
      stub_(v1::AttentionService::NewStub(channel_)),
      options_(std::move(options)),
      credentials_(std::move(credentials)),
      args_(std::move(args)) {}

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
  // Plain metadata rather than gRPC call credentials, which gRPC refuses on plaintext channels
  // (a server behind a TLS-terminating proxy still wants the token).
  if (!options_.bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
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

v1::BackwardRequest FullBackwardRequest(const v1::ForwardRequest& forward,
                                        const v1::ForwardResponse& answer, const v1::Tensor& dout,
                                        const ContextBackwardOptions& options) {
  v1::BackwardRequest request;
  *request.mutable_dout() = dout;
  *request.mutable_q() = forward.q();
  *request.mutable_k() = forward.k();
  *request.mutable_v() = forward.v();
  *request.mutable_out() = answer.out();
  *request.mutable_lse() = answer.lse();
  *request.mutable_cu_seqlens_q() = forward.cu_seqlens_q();
  *request.mutable_cu_seqlens_k() = forward.cu_seqlens_k();
  *request.mutable_options() = forward.options();
  request.set_deterministic(options.deterministic);
  return request;
}

v1::AttentionService::Stub* Client::StubFor(const std::string& address) {
  if (address.empty()) return stub_.get();
  std::lock_guard<std::mutex> lock(replicas_mu_);
  auto& [channel, stub] = replicas_[address];
  if (stub == nullptr) {
    channel = grpc::CreateCustomChannel(address, credentials_, args_);
    stub = v1::AttentionService::NewStub(channel);
  }
  return stub.get();
}

absl::StatusOr<v1::BackwardResponse> Client::BackwardOnContext(
    const v1::ForwardRequest& forward, const v1::ForwardResponse& answer,
    const v1::Tensor& dout, const ContextBackwardOptions& options) {
  return BackwardOnContext(answer.context_id(), answer.context_address(), dout, options,
                           [&] { return FullBackwardRequest(forward, answer, dout, options); });
}

absl::StatusOr<v1::BackwardResponse> Client::BackwardOnContext(
    const std::string& context_id, const std::string& context_address, const v1::Tensor& dout,
    const ContextBackwardOptions& options,
    const std::function<v1::BackwardRequest()>& full_request) {
  if (!context_id.empty()) {
    v1::BackwardRequest request;
    *request.mutable_dout() = dout;
    request.set_context_id(context_id);
    request.set_deterministic(options.deterministic);
    request.set_keep_context(options.keep_context);
    grpc::ClientContext context;
    PrepareContext(context);
    v1::BackwardResponse response;
    const grpc::Status status = StubFor(context_address)->Backward(&context, request, &response);
    if (status.ok()) return response;
    // Anything else is the request's own fault or the server's, and would fail in full too.
    const bool gone = status.error_code() == grpc::StatusCode::NOT_FOUND;
    const bool replica_unreachable = !context_address.empty() &&
                                     status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!gone && !replica_unreachable) return FromGrpc(status);
  }
  return Backward(full_request());
}

absl::StatusOr<bool> Client::ReleaseContext(const std::string& context_id,
                                            const std::string& context_address) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ReleaseContextRequest request;
  request.set_context_id(context_id);
  v1::ReleaseContextResponse response;
  if (absl::Status s = FromGrpc(StubFor(context_address)->ReleaseContext(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response.released();
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ServerInfo info;
  if (absl::Status s = FromGrpc(stub_->GetServerInfo(&context, {}, &info)); !s.ok()) return s;
  return info;
}

}  // namespace attnserve
