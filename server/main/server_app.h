// Composes one attnserve process: device registry, engine, gRPC and HTTP frontends, metrics;
// and shuts them down gracefully (readiness off, in-flight work finished, then stop).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/devices/device_registry.h"
#include "server/main/grpc_abuse_limits.h"
#include "server/engine/local_engine.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/auth/token_file_reloader.h"
#include "server/transport/auth/token_store.h"
#include "server/transport/call_slots.h"
#include "server/transport/data/data_server.h"
#include "server/transport/grpc/attention_service.h"
#include "server/transport/grpc/health_service.h"
#include "server/transport/grpc/inference_service.h"
#include "server/transport/http/http_server.h"
#include "server/transport/http/inference_rest.h"
#include "server/transport/oip/inference_protocol.h"
#include "server/transport/tls/tls_material.h"

namespace grpc {
class Server;
}

namespace attnserve {

struct ServerConfig {
  std::string host = "0.0.0.0";
  int grpc_port = 8001;
  int http_port = 8000;
  int http_threads = 32;
  std::string devices = "auto";
  std::string emulate_compute_capability;  // "7.5": GPUs route as that architecture (tests)
  engine::EngineOptions engine;
  // This replica's gRPC address as clients reach it (--advertise_address); empty: unknown.
  std::string advertise_address;
  // Benchmarks only: answer every valid request with zeros, computing nothing
  // (engine/transport_ceiling_engine.h).
  bool transport_ceiling = false;
  absl::Duration drain_timeout = absl::Seconds(30);
  // Connections older than this are closed gracefully (GOAWAY) so clients re-resolve and
  // spread over replicas added since; zero keeps connections forever.
  absl::Duration max_connection_age = absl::ZeroDuration();
  transport::CallLimits call_limits;
  // HTTP/2 streams (calls) one client connection may have open; more wait on the client side.
  int max_concurrent_streams_per_connection = 100;
  // The server pings each connection this often, and closes it when a ping goes unanswered
  // for keepalive_timeout, so dead clients do not hold calls and memory.
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // Client pings closer together than this (or on connections without calls, unless
  // permitted) count as strikes; past two the connection is closed with too_many_pings.
  absl::Duration keepalive_min_client_ping_interval = absl::Seconds(10);
  bool keepalive_permit_without_calls = false;
  // Compression off, header block and handshake bounds (main/grpc_abuse_limits.h).
  GrpcAbuseLimits grpc_abuse_limits;
  int http_request_timeout_ms = 2000;
  int http_max_request_bytes = 8192;
  int64_t http_max_json_bytes = int64_t{16} << 20;  // of a /v2 inference body
  // TLS on both ports when tls.cert_file is set; mTLS when tls.client_ca_file is too.
  transport::TlsFiles tls;
  // Bearer tokens (one per line) every AttentionService call and /v1/info must carry; empty:
  // no authentication. Reloaded when the file changes and on ReloadTokens().
  std::string auth_tokens_file;
  // With tokens: whether grpc.health.v1, /healthz, /readyz and /metrics stay open to callers
  // without one (probes and scrapers usually have none).
  bool auth_open_health_and_metrics = true;
  // The bulk data path (transport/data/data_server.h); data_channel.port 0: off. It serves
  // TLS with `tls` as the gRPC port does. A port that cannot be bound leaves it off rather than
  // failing startup: clients fall back to gRPC, and servers started side by side with the
  // default port (tests, benchmarks) keep working.
  transport::data::DataServerOptions data_channel;
  // The Open Inference Protocol's shared-memory extension (off unless allowed).
  transport::oip::SharedMemoryOptions shared_memory;
};

class ServerApp {
 public:
  static absl::StatusOr<std::unique_ptr<ServerApp>> Start(const ServerConfig& config,
                                                          const devices::GpuLister& list_gpus);
  ~ServerApp();

  // Readiness turns NOT_SERVING, new calls are refused, accepted ones finish (up to
  // drain_timeout), then everything stops. Idempotent.
  void Shutdown();

  // Re-reads the tokens file now (SIGHUP); a failure revokes every token until the file is
  // fixed. No-op without a tokens file.
  void ReloadTokens();
  // One line on TLS and authentication, for the startup log (names files, never secrets).
  std::string SecuritySummary() const;
  // One line on the data path, for the startup log: where it listens, or why it is off.
  const std::string& DataChannelSummary() const { return data_summary_; }

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_->port(); }
  const engine::Engine& engine() const { return *engine_; }

 private:
  explicit ServerApp(const ServerConfig& config);
  // Starts the data path unless it is off, and records where it listens in `call_limits`
  // (ServerInfo.data_channel).
  // `tls` null: plain TCP, else TLS (mTLS with client CAs) as on the gRPC port.
  void StartDataChannel(const transport::TlsMaterial* tls, const transport::Authenticator* auth,
                        transport::CallLimits* call_limits);

  const ServerConfig config_;
  std::unique_ptr<metrics::ServerMetrics> metrics_;
  std::unique_ptr<transport::TokenStore> tokens_;
  std::unique_ptr<transport::TokenFileReloader> token_reloader_;
  std::unique_ptr<transport::Authenticator> authenticator_;
  // Before the engine: calls still queued when the engine stops answer into the data path.
  std::unique_ptr<transport::CallSlots> slots_;
  std::unique_ptr<transport::data::DataServer> data_;
  std::string data_summary_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<transport::AttentionServiceImpl> service_;
  std::unique_ptr<transport::HealthService> health_;
  // The Open Inference Protocol (gRPC and REST share the first).
  std::unique_ptr<transport::oip::InferenceProtocol> inference_protocol_;
  std::unique_ptr<transport::InferenceServiceImpl> inference_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // Before http_, which serves it under /v2 and stops (joining its threads) first.
  std::unique_ptr<transport::InferenceRestHandler> inference_rest_;
  std::unique_ptr<transport::HttpServer> http_;
  int grpc_port_ = 0;
  std::atomic<bool> ready_{false};
  std::atomic<bool> shut_down_{false};
};

}  // namespace attnserve
