// attnserve::Client: a thin C++ client of the AttentionService. Messages are the wire's own
// (attnserve/v1/attention.pb.h); tensor_codec.h builds and reads their tensors.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace attnserve {

// TLS towards a server started with --tls_cert_file (and, for mTLS, --tls_client_ca_file).
struct TlsOptions {
  bool enabled = false;
  // PEM CA certificates the server's certificate must chain to; empty: the system's roots.
  std::string root_certificates_file;
  // PEM client certificate (chain) and its private key, for servers that require one (mTLS).
  std::string certificate_chain_file;
  std::string private_key_file;
  // The name the server's certificate must carry, when it is not the target's host name.
  std::string server_name;
};

struct ClientOptions {
  // Largest message sent or received; attention tensors are large.
  int max_message_bytes = 1 << 30;
  // Per-call deadline, synchronous and asynchronous calls alike; none by default.
  std::optional<std::chrono::milliseconds> timeout;
  // gRPC shares one TCP connection between channels to the same target with equal arguments.
  // Clients with different connection ids never share one (load tests spread calls over
  // several connections this way).
  int connection_id = 0;
  TlsOptions tls;
  // Sent as "authorization: Bearer <token>" on every call when not empty (servers started with
  // --auth_tokens_file refuse calls without an accepted one: UNAUTHENTICATED).
  std::string bearer_token;
};

// The token in a token file: its first line that is neither blank nor a '#' comment (the
// server's tokens-file format, so one file can serve both).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// How a backward on a saved context runs (BackwardRequest's own fields besides the tensors).
struct ContextBackwardOptions {
  bool deterministic = false;
  // Keep the context after this backward (e.g. to run it again); by default it is released.
  bool keep_context = false;
};

// The complete BackwardRequest of a forward: q, k, v, offsets and options from what it sent,
// out and lse from what it got, and `dout`.
v1::BackwardRequest FullBackwardRequest(const v1::ForwardRequest& forward,
                                        const v1::ForwardResponse& answer, const v1::Tensor& dout,
                                        const ContextBackwardOptions& options = {});

class Client {
 public:
  // Called once per asynchronous call with its outcome, on one of gRPC's threads: keep it
  // short and never block in it (it may start further calls).
  using ForwardCallback = std::function<void(absl::StatusOr<v1::ForwardResponse>)>;
  using BackwardCallback = std::function<void(absl::StatusOr<v1::BackwardResponse>)>;

  // `target` is a gRPC target such as "localhost:8001" or "dns:///attnserve:8001". Fails when
  // a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});
  ~Client();

  absl::StatusOr<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  absl::StatusOr<v1::BackwardResponse> Backward(const v1::BackwardRequest& request);
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // Saved contexts. A Forward with keep_context set answers a context_id (and, from servers
  // that know their address, the replica's context_address); its backward then sends only dout:
  //
  //   request.set_keep_context(true);
  //   auto answer = client->Forward(request);                          // out, lse, context_id
  //   ... training step ...
  //   auto grads = client->BackwardOnContext(request, *answer, dout);  // sends dout only
  //
  // When the server no longer has the context (NOT_FOUND: expired, evicted, released, another
  // replica or a restarted server), or kept none (empty id: over its budget), or its replica
  // cannot be reached, the backward is sent in full to the target, so the caller never sees the
  // difference. A context_address other than the target gets the backward (a client spread
  // over replicas reaches the one that holds the context; with TLS its certificate must name
  // that address, or tls.server_name must be set).
  absl::StatusOr<v1::BackwardResponse> BackwardOnContext(
      const v1::ForwardRequest& forward, const v1::ForwardResponse& answer,
      const v1::Tensor& dout, const ContextBackwardOptions& options = {});
  // The same for callers that keep their tensors elsewhere: `full_request` builds the complete
  // request, called only when it must be sent.
  absl::StatusOr<v1::BackwardResponse> BackwardOnContext(
      const std::string& context_id, const std::string& context_address, const v1::Tensor& dout,
      const ContextBackwardOptions& options,
      const std::function<v1::BackwardRequest()>& full_request);
  // Frees a context the caller will not use (a forward without backward, e.g. evaluation).
  // Returns whether the server still held it.
  absl::StatusOr<bool> ReleaseContext(const std::string& context_id,
                                      const std::string& context_address = "");

  // Asynchronous calls: return at once; `done` runs exactly once when the call ends. The call
  // keeps what it needs (context, request, response) alive until then, so the caller may drop
  // its request right after starting it. The reference forms copy the request; the shared_ptr
  // forms share it, for callers that send one request many times. Destroying the Client waits
  // until every call it started has finished its `done`, so never destroy it from inside one.
  void ForwardAsync(const v1::ForwardRequest& request, ForwardCallback done);
  void ForwardAsync(std::shared_ptr<const v1::ForwardRequest> request, ForwardCallback done);
  void BackwardAsync(const v1::BackwardRequest& request, BackwardCallback done);
  void BackwardAsync(std::shared_ptr<const v1::BackwardRequest> request, BackwardCallback done);

 private:
  template <typename Request, typename Response>
  friend struct AsyncCall;

  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options,
         std::shared_ptr<grpc::ChannelCredentials> credentials, grpc::ChannelArguments args);
  void PrepareContext(grpc::ClientContext& context) const;
  // The stub for a context's replica: the target's own when `address` is empty, else one
  // channel per address, made on first use with the target's credentials and arguments.
  v1::AttentionService::Stub* StubFor(const std::string& address);
  void AsyncCallStarted();
  void AsyncCallFinished();

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  ClientOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const grpc::ChannelArguments args_;
  std::mutex replicas_mu_;
  std::map<std::string, std::pair<std::shared_ptr<grpc::Channel>,
                                  std::unique_ptr<v1::AttentionService::Stub>>>
      replicas_;

  // Asynchronous calls in flight. gRPC runs their callbacks on threads of a completion queue
  // that the channel releases when destroyed; releasing it from one of those threads (as the
  // last call's cleanup would, were calls to own the channel) aborts inside gRPC, so instead
  // the Client, and with it the channel, outlives its calls.
  std::mutex calls_mu_;
  std::condition_variable calls_done_;
  int64_t calls_in_flight_ = 0;
};

}  // namespace attnserve
