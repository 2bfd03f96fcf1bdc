// The HTTP port (civetweb): /healthz (process alive), /readyz (accepting work), /metrics
// (Prometheus text exposition) and /v1/info (ServerInfo as JSON). Read-only; compute RPCs are
// on gRPC.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/engine.h"
#include "server/metrics/server_metrics.h"

class CivetServer;
class CivetHandler;

namespace attnserve::transport {

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  int num_threads = 4;
  std::string version;
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
  std::unique_ptr<CivetServer> server_;
};

}  // namespace attnserve::transport
