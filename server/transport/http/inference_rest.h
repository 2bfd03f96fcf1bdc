// The Open Inference Protocol's REST API (KServe v2) under /v2 on the HTTP port, the REST
// frontend of the same oip::InferDispatcher the gRPC service uses: server and model
// live/ready, metadata, statistics (Triton's extension), Triton's system shared memory
// extension, and inference (JSON tensors and the binary-tensor extension). Authentication,
// the max_concurrent_requests slots, deadlines, priority and the request metrics apply as on
// gRPC. Errors are `{"error": "..."}` with the HTTP status rest_status.h maps them to.
//
// civetweb runs each request on one of its worker threads, and an inference holds its thread
// until the answer is written: so inferences may hold at most `max_inferences` threads at
// once (the rest stay free for probes and scrapes), and each waits at most until its
// deadline plus `answer_grace`, after which it is abandoned (the engine drops it if it has
// not run) and answered 504.
#pragma once

#include <CivetServer.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_limits.h"
#include "server/transport/call_slots.h"
#include "server/transport/http/rest_exchange.h"
#include "server/transport/oip/infer_dispatcher.h"

namespace attnserve::transport {

struct InferenceRestOptions {
  std::string version;
  CallLimits limits;
  // Null: none needed. `health_auth` guards /v2/health/* and model readiness, `auth` the rest.
  const Authenticator* auth = nullptr;
  const Authenticator* health_auth = nullptr;
  std::function<bool()> is_ready;             // unset: always ready
  int64_t max_body_bytes = int64_t{1} << 30;  // the engine's max_message_bytes
  // JSON beyond this is refused (its parsed form takes many times its size).
  int64_t max_json_bytes = int64_t{16} << 20;
  int max_inferences = 16;
  // Calls without a deadline (no --max_deadline_seconds cap, no `timeout` parameter) get
  // this one over HTTP, so no inference holds a thread without bound.
  absl::Duration default_deadline = absl::Minutes(10);
  // How long past its deadline an inference's thread waits for the answer (a running
  // request stops at its deadline on the CPU; a GPU kernel finishes what it started).
  absl::Duration answer_grace = absl::Minutes(1);
};

class InferenceRestHandler : public CivetHandler {
 public:
  // `dispatcher`, `metrics` and `slots` must outlive the handler.
  InferenceRestHandler(oip::InferDispatcher* dispatcher, metrics::ServerMetrics* metrics,
                       CallSlots* slots, InferenceRestOptions options);

  bool handleGet(CivetServer* server, mg_connection* conn) override;
  bool handlePost(CivetServer* server, mg_connection* conn) override;

 private:
  using Path = std::vector<std::string>;
  RestResponse Get(mg_connection* conn, const Path& path);
  RestResponse Post(mg_connection* conn, const Path& path);
  // Register a region of `name` for `principal` from a registration body (Triton's).
  absl::Status RegisterSystem(const std::string& principal, const std::string& name,
                              const std::string& body);
  absl::Status RegisterCuda(const std::string& principal, const std::string& name,
                            const std::string& body);
  // Authenticates with `auth`, runs `body` when accepted and records the call as `rpc`.
  RestResponse Call(mg_connection* conn, const char* rpc, const Authenticator* auth,
                    const std::function<absl::StatusOr<RestResponse>()>& body);
  // POST /v2/models/<model>[/versions/<version>]/infer (rest_infer_call.cc).
  RestResponse Infer(mg_connection* conn, const std::string& model, const std::string& version);
  // Who calls (ownership of shared-memory regions); empty without authentication.
  std::string PrincipalOf(mg_connection* conn) const;
  absl::StatusOr<RestResponse> RunInfer(mg_connection* conn, const std::string& model,
                                        const std::string& version, absl::Time start);

  oip::InferDispatcher* const dispatcher_;
  metrics::ServerMetrics* const metrics_;
  CallSlots* const slots_;
  const InferenceRestOptions options_;
  std::atomic<int> inferences_{0};  // civetweb threads inferences hold now
};

}  // namespace attnserve::transport
