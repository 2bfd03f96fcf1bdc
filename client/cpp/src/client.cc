// attnserve::Client: creation, the synchronous calls and saved contexts; the asynchronous
// calls are in client_async.cc. Forward and Backward go through shared memory when
// shared_memory_route.h says so, else take the data channel through data_path.h when the
// transport is the data channel, else gRPC.
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
#include "client/cpp/src/call_workers.h"
#include "client/cpp/src/data_path.h"
#include "client/cpp/src/grpc_status.h"
#include "client/cpp/src/shared_memory_route.h"

namespace attnserve {
namespace {

using internal::FromGrpc;

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
  return std::unique_ptr<Client>(new Client(target, std::move(channel), options));
}

Client::Client(std::string target, std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : target_(std::move(target)),
      channel_(std::move(channel)),
      stub_(v1::AttentionService::NewStub(channel_)),
      options_(std::move(options)),
      data_(std::make_unique<internal::DataPath>(target_, options_,
                                                 [this] { return GetServerInfo(); })),
      shared_memory_(std::make_unique<internal::SharedMemoryRoute>(
          target_, options_.shared_memory, channel_,
          [this](grpc::ClientContext& context) { PrepareContext(context); })),
      workers_(std::make_unique<internal::CallWorkers>(options_.async_workers)) {}

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

template <typename Response, typename DataCall>
std::optional<absl::StatusOr<Response>> Client::OverDataChannel(bool fits, DataCall call) {
  if (!fits || options_.transport == Transport::kGrpc) return std::nullopt;
  // A session that broke (a restarted server, a lost connection) is replaced once and the
  // call repeated on the new one.
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<std::shared_ptr<DataChannelClient>> session = data_->Session();
    if (!session.ok()) return session.status();
    if (*session == nullptr) return std::nullopt;
    absl::StatusOr<Response> result = call(**session);
    if (result.ok() || attempt > 0 || !data_->Dropped(*session)) return result;
  }
}

absl::StatusOr<std::string> Client::ActiveTransport() {
  absl::StatusOr<bool> shared_memory = shared_memory_->Active();
  if (!shared_memory.ok()) return shared_memory.status();
  if (*shared_memory) return std::string("shared memory");
  if (options_.transport == Transport::kGrpc) return std::string("grpc");
  absl::StatusOr<std::shared_ptr<DataChannelClient>> session = data_->Session();
  if (!session.ok()) return session.status();
  if (*session == nullptr) return std::string("grpc");
  return absl::StrCat("data channel (", (*session)->connections(), " connection(s))");
}

absl::StatusOr<v1::ForwardResponse> Client::Forward(const v1::ForwardRequest& request) {
  if (auto result = shared_memory_->Forward(request)) return *std::move(result);
  if (auto result = OverDataChannel<v1::ForwardResponse>(
          internal::FitsDataChannel(request), [&](DataChannelClient& session) {
            absl::StatusOr<v1::ForwardResponse> answer = session.Forward(request);
            // The data channel's RESPONSE names no replica; the context is on the one the
            // session reaches, whose gRPC address its ServerInfo gave (empty: none, as on
            // gRPC from a server without --advertise_address).
            if (answer.ok() && !answer->context_id().empty() &&
                answer->context_address().empty()) {
              answer->set_context_address(data_->replica_address());
            }
            return answer;
          })) {
    return *std::move(result);
  }
  return GrpcForward(request);
}

absl::StatusOr<v1::BackwardResponse> Client::Backward(const v1::BackwardRequest& request) {
  if (auto result = shared_memory_->Backward(request)) return *std::move(result);
  if (auto result = OverDataChannel<v1::BackwardResponse>(
          internal::FitsDataChannel(request),
          [&](DataChannelClient& session) { return session.Backward(request); })) {
    return *std::move(result);
  }
  return GrpcBackward(request);
}

absl::StatusOr<v1::ForwardResponse> Client::GrpcForward(const v1::ForwardRequest& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ForwardResponse response;
  if (absl::Status s = FromGrpc(stub_->Forward(&context, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<v1::BackwardResponse> Client::GrpcBackward(const v1::BackwardRequest& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::BackwardResponse response;
  if (absl::Status s = FromGrpc(stub_->Backward(&context, request, &response)); !s.ok()) return s;
  return response;
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

Client* Client::ForReplica(const std::string& address) {
  if (address.empty() || address == target_ || address == data_->replica_address()) return this;
  std::lock_guard<std::mutex> lock(replicas_mu_);
  std::unique_ptr<Client>& replica = replicas_[address];
  if (replica == nullptr) {
    absl::StatusOr<std::unique_ptr<Client>> made = Create(address, options_);
    // Only a malformed address fails here (this Client's TLS files were read): the call then
    // goes to the target, which answers NOT_FOUND and gets the backward in full.
    if (!made.ok()) return this;
    replica = *std::move(made);
  }
  return replica.get();
}

absl::StatusOr<v1::BackwardResponse> Client::BackwardOnContext(
    const v1::ForwardRequest& forward, const v1::ForwardResponse& answer,
    const v1::Tensor& dout, const ContextBackwardOptions& options) {
  return BackwardOnContext(
      answer.context_id(), answer.context_address(), dout, options,
      [&] { return FullBackwardRequest(forward, answer, dout, options); },
      std::vector<int64_t>(forward.k().shape().begin(), forward.k().shape().end()),
      std::vector<int32_t>(forward.cu_seqlens_q().begin(), forward.cu_seqlens_q().end()),
      std::vector<int32_t>(forward.cu_seqlens_k().begin(), forward.cu_seqlens_k().end()));
}

absl::StatusOr<v1::BackwardResponse> Client::BackwardOnContext(
    const std::string& context_id, const std::string& context_address, const v1::Tensor& dout,
    const ContextBackwardOptions& options,
    const std::function<v1::BackwardRequest()>& full_request,
    const std::vector<int64_t>& k_shape, const std::vector<int32_t>& cu_seqlens_q,
    const std::vector<int32_t>& cu_seqlens_k) {
  if (!context_id.empty()) {
    v1::BackwardRequest request;
    *request.mutable_dout() = dout;
    request.mutable_cu_seqlens_q()->Add(cu_seqlens_q.begin(), cu_seqlens_q.end());
    request.mutable_cu_seqlens_k()->Add(cu_seqlens_k.begin(), cu_seqlens_k.end());
    request.set_context_id(context_id);
    request.set_deterministic(options.deterministic);
    request.set_keep_context(options.keep_context);
    Client* replica = ForReplica(context_address);
    absl::StatusOr<v1::BackwardResponse> result;
    if (auto over_data = replica->OverDataChannel<v1::BackwardResponse>(
            internal::FitsDataChannel(request, k_shape), [&](DataChannelClient& session) {
              return session.BackwardOnContext(request, k_shape);
            })) {
      result = *std::move(over_data);
    } else {
      result = replica->GrpcBackward(request);
    }
    if (result.ok()) return result;
    // Anything else is the request's own fault or the server's, and would fail in full too.
    const bool gone = absl::IsNotFound(result.status());
    const bool replica_unreachable = replica != this && absl::IsUnavailable(result.status());
    if (!gone && !replica_unreachable) return result.status();
  }
  return Backward(full_request());
}

absl::StatusOr<bool> Client::ReleaseContext(const std::string& context_id,
                                            const std::string& context_address) {
  Client* replica = ForReplica(context_address);
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ReleaseContextRequest request;
  request.set_context_id(context_id);
  v1::ReleaseContextResponse response;
  if (absl::Status s = FromGrpc(replica->stub_->ReleaseContext(&context, request, &response));
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
