// attnserve::Client: a thin C++ client of the AttentionService. Messages are the wire's own
// (attnserve/v1/attention.pb.h); tensor_codec.h builds and reads their tensors.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/tls_options.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace attnserve {

// Where Forward and Backward send their tensors.
enum class Transport {
  // The server's data channel (ServerInfo.data_channel: raw tensor bytes over TCP, chunked
  // and striped over several connections) when it offers one this client may use, else gRPC.
  // Decided on the first Forward or Backward (one GetServerInfo) and kept.
  kAuto,
  // Everything over gRPC, exactly as before the data channel existed.
  kGrpc,
  // The data channel or an error: FAILED_PRECONDITION saying why when the server offers none
  // this client may use, UNAVAILABLE when it cannot be reached.
  kDataChannel,
};

// Whether Forward and Backward pass their tensors through POSIX shared memory (Triton's system
// shared memory extension on the server's gRPC port), as the Python client's shared_memory=.
enum class SharedMemory {
  // Never: the transport above.
  kOff,
  // When the target is this host (loopback, "localhost", this host's own name or addresses)
  // and the server, started with --allow_shared_memory, maps the client's region, which the
  // first call finds out by registering one (a refusal that can change, such as the server's
  // region limit, is asked again on the next call); else, silently, the transport above.
  kAuto,
  // Shared memory or an error: FAILED_PRECONDITION saying why ("shared_memory=on: ...") when
  // the target is not this host or the server will not map the client's memory; the code the
  // server gave for a refusal that may pass (RESOURCE_EXHAUSTED, UNAVAILABLE).
  kOn,
};

struct ClientOptions {
  // Largest message sent or received; attention tensors are large.
  int max_message_bytes = 1 << 30;
  // Per-call deadline, synchronous and asynchronous calls alike, on either transport; none by
  // default.
  std::optional<std::chrono::milliseconds> timeout;
  // gRPC shares one TCP connection between channels to the same target with equal arguments.
  // Clients with different connection ids never share one (load tests spread calls over
  // several connections this way).
  int connection_id = 0;
  TlsOptions tls;
  // Sent as "authorization: Bearer <token>" on every call when not empty (servers started with
  // --auth_tokens_file refuse calls without an accepted one: UNAUTHENTICATED), and in the data
  // channel's HELLO.
  std::string bearer_token;

  Transport transport = Transport::kAuto;
  // The data channel session: its TCP connections (capped by the server's
  // max_connections_per_session) and chunk size (capped by its max_chunk_bytes).
  int data_connections = 4;
  int64_t data_chunk_bytes = int64_t{4} << 20;
  // Threads that run asynchronous calls over the data channel or through shared memory
  // (whose calls block): one per call in flight up to this many, further calls wait for one.
  int async_workers = 64;

  // Off by default (the Python client's is on for calls of 2 MB or more): on the H100 a
  // 269.5 MB forward took a median 25-27 ms against the data channel's 30-32, but the first
  // call's new region costs about 200 ms (bench/RESULTS.md, "Co-located clients", row 5),
  // and this client copies on up to 4 threads without the Python client's chunk pipeline.
  // A call through shared memory answers as the others do, except that the protocol has no
  // saved contexts (a forward with keep_context gets an empty context_id, so its
  // BackwardOnContext goes in full) and reports no execution (empty device and kernel, zero
  // times). Requests the data channel cannot carry (FitsDataChannel: tensors that disagree with
  // their shapes) and backwards on a context go the other ways. The regions are unregistered
  // and unlinked when the Client is destroyed; a process killed first leaves
  // /dev/shm/attnserve-<pid>-* behind.
  SharedMemory shared_memory = SharedMemory::kOff;
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

namespace internal {
class CallWorkers;
class DataPath;
class SharedMemoryRoute;
}  // namespace internal

// Thread-safe: share one Client between the threads of a process.
//
// Transport: Forward, Backward and BackwardOnContext (synchronous or not) move their tensors
// through shared memory when ClientOptions::shared_memory asks for it and allows, else over
// the server's data channel when ClientOptions::transport allows and the server offers
// one this client may use (the same TLS, CA, client certificate and token as the gRPC
// channel), else over gRPC; answers, errors and their codes are the same either way. A
// request whose tensors disagree with their shapes goes over gRPC, whose error names the
// field. GetServerInfo and ReleaseContext always use gRPC, the control plane.
class Client {
 public:
  // Called once per asynchronous call with its outcome, on one of gRPC's threads or one of the
  // Client's workers: keep it short and never block in it (it may start further calls).
  using ForwardCallback = std::function<void(absl::StatusOr<v1::ForwardResponse>)>;
  using BackwardCallback = std::function<void(absl::StatusOr<v1::BackwardResponse>)>;

  // `target` is a gRPC target such as "localhost:8001" or "dns:///attnserve:8001". Fails when
  // a TLS file cannot be read. Connects nothing yet.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});
  ~Client();

  absl::StatusOr<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  absl::StatusOr<v1::BackwardResponse> Backward(const v1::BackwardRequest& request);
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // Where Forward and Backward go: "shared memory", "grpc", or "data channel (N
  // connection(s))". Decides the transport first when no call has yet (an error when that
  // fails as a call would).
  absl::StatusOr<std::string> ActiveTransport();

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
  // over replicas reaches the one that holds the context, over its data channel when it has
  // one; with TLS its certificate must name that address, or tls.server_name must be set).
  absl::StatusOr<v1::BackwardResponse> BackwardOnContext(
      const v1::ForwardRequest& forward, const v1::ForwardResponse& answer,
      const v1::Tensor& dout, const ContextBackwardOptions& options = {});
  // The same for callers that keep their tensors elsewhere: `full_request` builds the complete
  // request, called only when it must be sent. `k_shape` is the forward's k shape
  // [total_k, num_heads_k, head_dim], which sizes dk and dv for the data channel; without it
  // the dout-only backward goes over gRPC. The forward's offsets, when given, let the server
  // run a large backward group by group while dout still arrives.
  absl::StatusOr<v1::BackwardResponse> BackwardOnContext(
      const std::string& context_id, const std::string& context_address, const v1::Tensor& dout,
      const ContextBackwardOptions& options,
      const std::function<v1::BackwardRequest()>& full_request,
      const std::vector<int64_t>& k_shape = {}, const std::vector<int32_t>& cu_seqlens_q = {},
      const std::vector<int32_t>& cu_seqlens_k = {});
  // Frees a context the caller will not use (a forward without backward, e.g. evaluation).
  // Returns whether the server still held it.
  absl::StatusOr<bool> ReleaseContext(const std::string& context_id,
                                      const std::string& context_address = "");

  // Asynchronous calls, so a training loop overlaps remote attention with its own work: they
  // return at once; `done` runs exactly once when the call ends. The call keeps what it needs
  // alive until then, so the caller may drop its request right after starting it. The
  // reference forms copy the request; the shared_ptr forms share it, for callers that send
  // one request many times. Over gRPC they are gRPC's own asynchronous calls; over the data
  // channel or through shared memory (whose calls block) they run on the Client's worker threads
  // (ClientOptions::async_workers). Destroying the Client waits until every call it started
  // has finished its `done`, so never destroy it from inside one.
  void ForwardAsync(const v1::ForwardRequest& request, ForwardCallback done);
  void ForwardAsync(std::shared_ptr<const v1::ForwardRequest> request, ForwardCallback done);
  void BackwardAsync(const v1::BackwardRequest& request, BackwardCallback done);
  void BackwardAsync(std::shared_ptr<const v1::BackwardRequest> request, BackwardCallback done);
  // BackwardOnContext in the background (full resend included); the forward, its answer and
  // dout are shared, not copied.
  void BackwardOnContextAsync(std::shared_ptr<const v1::ForwardRequest> forward,
                              std::shared_ptr<const v1::ForwardResponse> answer,
                              std::shared_ptr<const v1::Tensor> dout,
                              const ContextBackwardOptions& options, BackwardCallback done);

  // The asynchronous calls as futures:
  //   auto pending = client->ForwardFuture(request);
  //   ... other work ...
  //   absl::StatusOr<v1::ForwardResponse> answer = pending.get();
  std::future<absl::StatusOr<v1::ForwardResponse>> ForwardFuture(
      std::shared_ptr<const v1::ForwardRequest> request);
  std::future<absl::StatusOr<v1::BackwardResponse>> BackwardFuture(
      std::shared_ptr<const v1::BackwardRequest> request);
  std::future<absl::StatusOr<v1::BackwardResponse>> BackwardOnContextFuture(
      std::shared_ptr<const v1::ForwardRequest> forward,
      std::shared_ptr<const v1::ForwardResponse> answer, std::shared_ptr<const v1::Tensor> dout,
      const ContextBackwardOptions& options = {});

 private:
  template <typename Request, typename Response>
  friend struct AsyncCall;

  Client(std::string target, std::shared_ptr<grpc::Channel> channel, ClientOptions options);
  void PrepareContext(grpc::ClientContext& context) const;
  // The Client whose calls reach the replica at `address`: this one when `address` is empty,
  // the target, or the replica the data channel reaches; else one per address, made on first
  // use with this Client's options.
  Client* ForReplica(const std::string& address);
  // Runs `call(session)` on the data channel when the transport is the data channel
  // (deciding it first) and `fits`; nullopt: the caller sends it over gRPC.
  template <typename Response, typename DataCall>
  std::optional<absl::StatusOr<Response>> OverDataChannel(bool fits, DataCall call);
  absl::StatusOr<v1::ForwardResponse> GrpcForward(const v1::ForwardRequest& request);
  absl::StatusOr<v1::BackwardResponse> GrpcBackward(const v1::BackwardRequest& request);
  // Whether asynchronous calls go straight to gRPC's own (the transport is gRPC for good).
  bool AsyncOverGrpc();
  // Runs `work` on a worker thread as an asynchronous call (counted until it returns).
  void RunOnWorker(std::function<void()> work);
  void AsyncCallStarted();
  void AsyncCallFinished();

  const std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  const ClientOptions options_;
  std::unique_ptr<internal::DataPath> data_;
  std::unique_ptr<internal::SharedMemoryRoute> shared_memory_;
  std::mutex replicas_mu_;
  std::map<std::string, std::unique_ptr<Client>> replicas_;

  // Asynchronous calls in flight. gRPC runs their callbacks on threads of a completion queue
  // that the channel releases when destroyed; releasing it from one of those threads (as the
  // last call's cleanup would, were calls to own the channel) aborts inside gRPC, so instead
  // the Client, and with it the channel, outlives its calls.
  std::mutex calls_mu_;
  std::condition_variable calls_done_;
  int64_t calls_in_flight_ = 0;
  // Last, so its threads stop before anything they use goes.
  std::unique_ptr<internal::CallWorkers> workers_;
};

}  // namespace attnserve
