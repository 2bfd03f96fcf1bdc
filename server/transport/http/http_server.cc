#include "server/transport/http/http_server.h"

#include <CivetServer.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "server/transport/server_info.h"

namespace attnserve::transport {
namespace {

constexpr char kTextPlain[] = "text/plain; charset=utf-8";

struct HttpResponse {
  int status = 200;
  std::string content_type = kTextPlain;
  std::string body;
};

// A GET-only endpoint whose response a function computes; when `auth` is set, the request
// must carry an accepted "Authorization: Bearer <token>" header first.
class FunctionHandler : public CivetHandler {
 public:
  FunctionHandler(const Authenticator* auth, std::function<HttpResponse()> respond)
      : auth_(auth), respond_(std::move(respond)) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (auth_ != nullptr) {
      const char* header = mg_get_header(conn, "Authorization");
      const absl::Status status =
          auth_->Check(header == nullptr ? std::nullopt
                                         : std::optional<absl::string_view>(header));
      if (!status.ok()) {
        Send(conn, {401, kTextPlain, absl::StrCat(status.message(), "\n")},
             "WWW-Authenticate: Bearer\r\n");
        return true;
      }
    }
    Send(conn, respond_(), "");
    return true;
  }

 private:
  static void Send(mg_connection* conn, const HttpResponse& response,
                   const std::string& extra_headers) {
    mg_printf(conn,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
              "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
              response.status, mg_get_response_code_text(conn, response.status),
              response.content_type.c_str(), response.body.size(), extra_headers.c_str());
    mg_write(conn, response.body.data(), response.body.size());
  }

  const Authenticator* const auth_;
  std::function<HttpResponse()> respond_;
};

HttpResponse InfoJson(const engine::Engine& engine, const std::string& version,
                      const CallLimits& call_limits) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  const auto status = google::protobuf::util::MessageToJsonString(
      BuildServerInfo(engine, version, call_limits), &json, options);
  if (!status.ok()) return {500, kTextPlain, std::string(status.message())};
  return {200, "application/json", json};
}

// civetweb's init_ssl callback: the server's own certificate, key and client CAs, so civetweb
// needs no ssl_certificate file. `user_data` is the CivetServer under construction, whose user
// context is the TlsMaterial. Returns 1 (set up, civetweb adds nothing) or -1 (failed).
int InitSsl(void* ssl_ctx, void* user_data) {
  const auto* material =
      static_cast<const TlsMaterial*>(static_cast<CivetServer*>(user_data)->getUserContext());
  const absl::Status status = ConfigureServerSslContext(ssl_ctx, *material);
  if (!status.ok()) {
    std::fprintf(stderr, "attnserve: HTTPS: %s\n", std::string(status.message()).c_str());
    return -1;
  }
  return 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, const engine::Engine* engine,
    const metrics::ServerMetrics* metrics, std::function<bool()> is_ready) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  CivetCallbacks callbacks{};
  // civetweb's own errors (a failed start says only "null context" otherwise).
  callbacks.log_message = [](const mg_connection*, const char* message) {
    std::fprintf(stderr, "attnserve: http: %s\n", message);
    return 1;
  };
  if (options.tls.has_value()) {
    // civetweb loads OpenSSL at run time (libssl.so, libcrypto.so); say so plainly if it
    // cannot, rather than failing later or serving plain HTTP.
    server->tls_library_initialized_ = true;
    if ((mg_init_library(MG_FEATURES_TLS) & MG_FEATURES_TLS) == 0) {
      return absl::FailedPreconditionError(
          "HTTPS: civetweb could not load OpenSSL at run time (it opens libssl.so and "
          "libcrypto.so; on Debian they come with libssl-dev)");
    }
    server->tls_ = std::make_unique<TlsMaterial>(*options.tls);
    callbacks.init_ssl = InitSsl;
  }
  // A trailing 's' makes the port HTTPS.
  const std::vector<std::string> civet_options = {
      "listening_ports", absl::StrCat(options.host, ":", options.port, options.tls ? "s" : ""),
      "num_threads", absl::StrCat(options.num_threads),
      "request_timeout_ms", absl::StrCat(options.request_timeout_ms),
      "max_request_size", absl::StrCat(options.max_request_bytes)};
  try {
    server->server_ =
        std::make_unique<CivetServer>(civet_options, &callbacks, server->tls_.get());
  } catch (const CivetException& e) {
    return absl::UnavailableError(absl::StrCat("HTTP server could not listen on ", options.host,
                                               ":", options.port, ": ", e.what()));
  }
  const Authenticator* info_auth =
      options.auth != nullptr && options.auth->enabled() ? options.auth : nullptr;
  const Authenticator* health_auth = options.open_health_and_metrics ? nullptr : info_auth;
  auto add = [&](const char* uri, const Authenticator* auth,
                 std::function<HttpResponse()> respond) {
    server->handlers_.push_back(std::make_unique<FunctionHandler>(auth, std::move(respond)));
    server->server_->addHandler(uri, server->handlers_.back().get());
  };
  add("/healthz", health_auth, [failure = options.liveness_failure] {
    const std::string why = failure ? failure() : std::string();
    return why.empty() ? HttpResponse{200, kTextPlain, "ok\n"}
                       : HttpResponse{503, kTextPlain, absl::StrCat(why, "\n")};
  });
  add("/readyz", health_auth, [is_ready] {
    return is_ready() ? HttpResponse{200, kTextPlain, "ready\n"}
                      : HttpResponse{503, kTextPlain, "not ready\n"};
  });
  add("/metrics", health_auth, [metrics] {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics->Serialize()};
  });
  add("/v1/info", info_auth, [engine, version = options.version, limits = options.call_limits] {
    return InfoJson(*engine, version, limits);
  });
  if (options.inference_rest != nullptr) {
    server->server_->addHandler("/v2", options.inference_rest);
  }
  return server;
}

HttpServer::~HttpServer() {
  Stop();
  if (tls_library_initialized_) mg_exit_library();
}

int HttpServer::port() const {
  std::vector<int> ports = server_->getListeningPorts();
  return ports.empty() ? -1 : ports[0];
}

void HttpServer::Stop() {
  if (server_) server_->close();
}

}  // namespace attnserve::transport
