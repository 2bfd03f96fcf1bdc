#include "server/main/server_app.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/main/grpc_abuse_limits.h"
#include "server/transport/grpc/listener_watch.h"
#include "server/devices/capability_emulation.h"
#include "server/engine/transport_ceiling_engine.h"

namespace attnserve {
namespace {

// How long refused callers get to see UNAVAILABLE before the gRPC transport closes. A caller
// answered at the very end of the drain needs this long to send its next call and reach the
// engine's refusal; with 250 ms such a call on a loaded 2-core host (the server under TSan)
// arrived after the transport had closed and was reset with CANCELLED.
constexpr absl::Duration kRefusalLinger = absl::Seconds(1);
// Calls outside the engine (GetServerInfo, health) are short; past this they are cancelled.
constexpr absl::Duration kTransportShutdownTimeout = absl::Seconds(1);

int Milliseconds(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

std::shared_ptr<grpc::ServerCredentials> GrpcCredentials(
    const std::optional<transport::TlsMaterial>& tls) {
  if (!tls.has_value()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      tls->mutual() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = tls->client_ca_pem;
  options.pem_key_cert_pairs.push_back({tls->private_key_pem, tls->cert_chain_pem});
  return grpc::SslServerCredentials(options);
}

}  // namespace

ServerApp::ServerApp(const ServerConfig& config) : config_(config) {}

absl::StatusOr<std::unique_ptr<ServerApp>> ServerApp::Start(
    const ServerConfig& config, const devices::GpuLister& list_gpus) {
  std::unique_ptr<ServerApp> app(new ServerApp(config));
  app->metrics_ = std::make_unique<metrics::ServerMetrics>(ATTNSERVE_VERSION);

  // Credentials first: a bad TLS or tokens file fails before any device is touched.
  std::optional<transport::TlsMaterial> tls;
  if (!config.tls.cert_file.empty()) {
    absl::StatusOr<transport::TlsMaterial> material = transport::LoadTlsMaterial(config.tls);
    if (!material.ok()) return material.status();
    tls = *std::move(material);
  }
  if (!config.auth_tokens_file.empty()) {
    app->tokens_ = std::make_unique<transport::TokenStore>();
    absl::StatusOr<std::unique_ptr<transport::TokenFileReloader>> reloader =
        transport::TokenFileReloader::Start(config.auth_tokens_file, app->tokens_.get());
    if (!reloader.ok()) return reloader.status();
    app->token_reloader_ = *std::move(reloader);
  }
  app->authenticator_ =
      std::make_unique<transport::Authenticator>(app->tokens_.get(), app->metrics_.get());
  const transport::Authenticator* compute_auth =
      app->tokens_ != nullptr ? app->authenticator_.get() : nullptr;
  const transport::Authenticator* health_auth =
      config.auth_open_health_and_metrics ? nullptr : compute_auth;

  absl::StatusOr<std::vector<devices::DeviceDescription>> devices =
      devices::ResolveDevices(config.devices, list_gpus);
  if (!devices.ok()) return devices.status();
  if (absl::Status s = devices::EmulateComputeCapability(config.emulate_compute_capability,
                                                         &*devices);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<engine::LocalEngine>> engine =
      engine::LocalEngine::Create(*devices, config.engine, app->metrics_.get());
  if (!engine.ok()) return engine.status();
  app->engine_ = *std::move(engine);
  if (config.transport_ceiling) {
    app->engine_ = std::make_unique<engine::TransportCeilingEngine>(std::move(app->engine_));
  }
  app->slots_ = std::make_unique<transport::CallSlots>(config.call_limits.max_concurrent_requests);
  transport::CallLimits call_limits = config.call_limits;
  app->StartDataChannel(tls.has_value() ? &*tls : nullptr, compute_auth, &call_limits);
  app->service_ = std::make_unique<transport::AttentionServiceImpl>(
      app->engine_.get(), app->metrics_.get(), ATTNSERVE_VERSION, call_limits, app->slots_.get(),
      compute_auth, config.advertise_address);
  ServerApp* raw = app.get();
  // Not ready while every device is out of service after a fault: the orchestrator sends the
  // traffic to replicas that can serve it until a reset brings one back. /readyz, the
  // inference protocol's ServerReady and grpc.health.v1 all answer from it.
  auto is_ready = [raw] {
    return raw->ready_.load() && transport::GrpcListenerFailure().empty() &&
           raw->engine_->AnyDeviceHealthy();
  };
  app->health_ = std::make_unique<transport::HealthService>(health_auth, is_ready);
  app->inference_protocol_ = std::make_unique<transport::oip::InferenceProtocol>(
      app->engine_.get(), *app->metrics_->registry(), config.shared_memory);
  app->inference_service_ = std::make_unique<transport::InferenceServiceImpl>(
      app->inference_protocol_->dispatcher(), app->metrics_.get(), app->slots_.get(),
      transport::InferenceServiceOptions{ATTNSERVE_VERSION, call_limits, compute_auth,
                                         health_auth, is_ready});

  // grpc.health.v1 is app->health_, not gRPC's built-in service (which cannot check tokens).
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  transport::WatchGrpcListener();
  grpc::ServerBuilder builder;
  const std::string grpc_address = absl::StrCat(config.host, ":", config.grpc_port);
  builder.AddListeningPort(grpc_address, GrpcCredentials(tls), &app->grpc_port_);
  // gRPC sets SO_REUSEPORT by default, so a second server on the same port would start and
  // silently take half of the new connections; without it the second one fails to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const int max_message = static_cast<int>(config.engine.limits.max_message_bytes);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  if (config.max_connection_age > absl::ZeroDuration()) {
    const int age_ms = static_cast<int>(absl::ToInt64Milliseconds(config.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, age_ms);
    // In-flight calls on an aged connection get as long as a drain to finish.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(config.drain_timeout)));
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             config.max_concurrent_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(config.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Milliseconds(config.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                             config.keepalive_permit_without_calls ? 1 : 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Milliseconds(config.keepalive_min_client_ping_interval));
  // Two strikes, then GOAWAY (gRPC's default, stated so it cannot drift to 0 = unlimited).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  ApplyGrpcAbuseLimits(config.grpc_abuse_limits, builder);
  builder.RegisterService(app->service_.get());
  builder.RegisterService(app->health_.get());
  builder.RegisterService(app->inference_service_.get());
  app->grpc_server_ = builder.BuildAndStart();
  if (app->grpc_server_ == nullptr || app->grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("gRPC server could not listen on ", grpc_address,
                                               " (in use by another process?)"));
  }

  transport::HttpServerOptions http_options;
  http_options.host = config.host;
  http_options.port = config.http_port;
  http_options.num_threads = config.http_threads;
  http_options.version = ATTNSERVE_VERSION;
  http_options.call_limits = call_limits;
  http_options.request_timeout_ms = config.http_request_timeout_ms;
  http_options.max_request_bytes = config.http_max_request_bytes;
  http_options.tls = tls;
  http_options.auth = compute_auth;
  http_options.open_health_and_metrics = config.auth_open_health_and_metrics;
  // Not alive when the gRPC listener gave up, or when every device is lost to this process
  // (faulted, and resets keep failing): only a restart brings either back.
  http_options.liveness_failure = [raw] {
    std::string why = transport::GrpcListenerFailure();
    return why.empty() ? raw->engine_->NeedsRestart() : why;
  };
  transport::InferenceRestOptions rest_options;
  rest_options.version = ATTNSERVE_VERSION;
  rest_options.limits = call_limits;
  rest_options.auth = compute_auth;
  rest_options.health_auth = health_auth;
  rest_options.is_ready = is_ready;
  rest_options.max_body_bytes = config.engine.limits.max_message_bytes;
  rest_options.max_json_bytes = config.http_max_json_bytes;
  // Inferences wait on civetweb's threads: half of them at most, so probes, scrapes and the
  // other endpoints always find one.
  rest_options.max_inferences = std::max(1, config.http_threads / 2);
  if (call_limits.answer_send_timeout != absl::InfiniteDuration()) {
    rest_options.answer_grace = call_limits.answer_send_timeout;
  }
  app->inference_rest_ = std::make_unique<transport::InferenceRestHandler>(
      app->inference_protocol_->dispatcher(), app->metrics_.get(), app->slots_.get(),
      rest_options);
  http_options.inference_rest = app->inference_rest_.get();
  absl::StatusOr<std::unique_ptr<transport::HttpServer>> http = transport::HttpServer::Start(
      http_options, app->engine_.get(), app->metrics_.get(), is_ready);
  if (!http.ok()) {
    return http.status();
  }
  app->http_ = *std::move(http);

  app->health_->SetServing(true);
  app->ready_ = true;
  return app;
}

void ServerApp::StartDataChannel(const transport::TlsMaterial* tls,
                                 const transport::Authenticator* auth,
                                 transport::CallLimits* call_limits) {
  const transport::data::DataServerOptions& options = config_.data_channel;
  if (options.port == 0) {
    data_summary_ = "data channel off (--data_port=0)";
    return;
  }
  transport::data::DataServerOptions with_limits = options;
  with_limits.max_deadline = config_.call_limits.max_deadline;
  absl::StatusOr<std::unique_ptr<transport::data::DataServer>> data =
      transport::data::DataServer::Start(with_limits, engine_.get(), metrics_.get(),
                                         slots_.get(), auth, tls);
  if (!data.ok()) {
    data_summary_ = absl::StrCat("data channel off: ", data.status().message(),
                                 " (clients use gRPC)");
    return;
  }
  data_ = *std::move(data);
  call_limits->data_channel.port = data_->port();
  call_limits->data_channel.max_chunk_bytes = options.max_chunk_bytes;
  call_limits->data_channel.max_connections_per_session = options.max_connections_per_session;
  call_limits->data_channel.tls = tls != nullptr;
  data_summary_ = absl::StrCat("data channel on ", options.host, ":", data_->port());
  if (tls != nullptr) absl::StrAppend(&data_summary_, tls->mutual() ? " (mTLS)" : " (TLS)");
}

ServerApp::~ServerApp() { Shutdown(); }

void ServerApp::ReloadTokens() {
  if (token_reloader_ != nullptr) (void)token_reloader_->Reload();
}

std::string ServerApp::SecuritySummary() const {
  std::string tls = "TLS off";
  if (!config_.tls.cert_file.empty()) {
    tls = absl::StrCat("TLS on (", config_.tls.cert_file, ")");
    if (!config_.tls.client_ca_file.empty()) {
      absl::StrAppend(&tls, ", client certificates required (", config_.tls.client_ca_file, ")");
    }
  }
  if (tokens_ == nullptr) return absl::StrCat(tls, "; no authentication");
  std::string summary = absl::StrCat(
      tls, "; bearer tokens required (", tokens_->size(), " from ", config_.auth_tokens_file,
      "), ", config_.auth_open_health_and_metrics ? "health and metrics open to all"
                                                  : "health and metrics need one too");
  if (config_.tls.cert_file.empty()) {
    absl::StrAppend(&summary, "; WARNING: tokens cross the network in plain text without TLS");
  }
  return summary;
}

void ServerApp::Shutdown() {
  if (shut_down_.exchange(true)) return;
  ready_ = false;
  // Start() may have failed part way: stop only what was started.
  if (grpc_server_ != nullptr) {
    // Health checks answer NOT_SERVING from now on; load balancers stop sending work.
    health_->Shutdown();
    if (data_ != nullptr) data_->StopAccepting();
    // The engine refuses new work with UNAVAILABLE (a clean, retryable answer) while the
    // accepted work finishes. Only then does gRPC shut down: it resets calls that arrive after
    // that point with CANCELLED, so callers get a moment to see the refusals first.
    if (!engine_->Drain(config_.drain_timeout)) {
      std::fprintf(stderr, "attnserve: drain timeout reached with %lld requests in flight\n",
                   static_cast<long long>(engine_->InflightCount()));
    }
    // Answered data channel calls get as long again to send their responses.
    if (data_ != nullptr && !data_->WaitForCalls(config_.drain_timeout)) {
      std::fprintf(stderr, "attnserve: drain timeout reached with data channel responses unsent\n");
    }
    absl::SleepFor(kRefusalLinger);
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + kTransportShutdownTimeout));
    grpc_server_->Wait();
  }
  if (data_ != nullptr) data_->Stop();
  if (engine_ != nullptr) engine_->Stop();
  if (http_ != nullptr) http_->Stop();
}

}  // namespace attnserve
