// The HTTP port (civetweb): /healthz (process alive and able to serve), /readyz (accepting
// work), /metrics (Prometheus text exposition), /v1/info (ServerInfo as JSON) and, when given
// its handler, the Open Inference Protocol's REST API under /v2. HTTPS (and mTLS) with `tls`;
// with an enabled Authenticator, /v1/info needs the bearer token like GetServerInfo, and the
// other pages too unless open_health_and_metrics.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/engine.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_limits.h"
#include "server/transport/tls/tls_material.h"

class CivetServer;
class CivetHandler;

namespace attnserve::transport {

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  int num_threads = 32;
  std::string version;
  CallLimits call_limits;  // reported in /v1/info
  // A connection that has not sent its whole request (or taken its reply) by then is closed,
  // so slow or stalled clients cannot hold the few worker threads.
  int request_timeout_ms = 2000;
  // Largest request head (request line + headers) accepted; larger ones are refused. Only /v2
  // takes bodies, and reads them within its own bounds.
  int max_request_bytes = 8192;
  std::optional<TlsMaterial> tls;  // absent: plain HTTP
  // Null or disabled: every page is open.
  const Authenticator* auth = nullptr;
  bool open_health_and_metrics = true;
  // Polled by /healthz: a non-empty answer says why the process is broken beyond repair (503
  // with that text, so the orchestrator restarts it). Unset: always alive.
  std::function<std::string()> liveness_failure;
  // Served under /v2 when set (the Open Inference Protocol's REST API, inference_rest.h);
  // must outlive the server.
  CivetHandler* inference_rest = nullptr;
};

class HttpServer {
 public:
  // `engine` and `metrics` must outlive the server; `is_ready` is polled by /readyz.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           const engine::Engine* engine,
                                                           const metrics::ServerMetrics* metrics,
                                                           std::function<bool()> is_ready);
  ~HttpServer();

  // The bound port (useful when started on port 0).
  int port() const;
  void Stop();

 private:
  HttpServer() = default;

  std::vector<std::unique_ptr<CivetHandler>> handlers_;
  // Read by civetweb's init_ssl callback while the server starts.
  std::unique_ptr<TlsMaterial> tls_;
  bool tls_library_initialized_ = false;
  std::unique_ptr<CivetServer> server_;
};

}  // namespace attnserve::transport
