#include "server/transport/http/http_server.h"

#include <CivetServer.h>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "server/transport/server_info.h"

namespace attnserve::transport {
namespace {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// A GET-only endpoint whose response a function computes.
class FunctionHandler : public CivetHandler {
 public:
  explicit FunctionHandler(std::function<HttpResponse()> respond)
      : respond_(std::move(respond)) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const HttpResponse response = respond_();
    mg_printf(conn,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
              response.status, mg_get_response_code_text(conn, response.status),
              response.content_type.c_str(), response.body.size());
    mg_write(conn, response.body.data(), response.body.size());
    return true;
  }

 private:
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
  if (!status.ok()) return {500, "text/plain; charset=utf-8", std::string(status.message())};
  return {200, "application/json", json};
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, const engine::Engine* engine,
    const metrics::ServerMetrics* metrics, std::function<bool()> is_ready) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  const std::vector<std::string> civet_options = {
      "listening_ports", absl::StrCat(options.host, ":", options.port),
      "num_threads", absl::StrCat(options.num_threads),
      "request_timeout_ms", absl::StrCat(options.request_timeout_ms),
      "max_request_size", absl::StrCat(options.max_request_bytes)};
  try {
    server->server_ = std::make_unique<CivetServer>(civet_options);
  } catch (const CivetException& e) {
    return absl::UnavailableError(absl::StrCat("HTTP server could not listen on ", options.host,
                                               ":", options.port, ": ", e.what()));
  }
  auto add = [&](const char* uri, std::function<HttpResponse()> respond) {
    server->handlers_.push_back(std::make_unique<FunctionHandler>(std::move(respond)));
    server->server_->addHandler(uri, server->handlers_.back().get());
  };
  add("/healthz", [] { return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}; });
  add("/readyz", [is_ready] {
    return is_ready() ? HttpResponse{200, "text/plain; charset=utf-8", "ready\n"}
                      : HttpResponse{503, "text/plain; charset=utf-8", "not ready\n"};
  });
  add("/metrics", [metrics] {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics->Serialize()};
  });
  add("/v1/info", [engine, version = options.version, limits = options.call_limits] {
    return InfoJson(*engine, version, limits);
  });
  return server;
}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const {
  std::vector<int> ports = server_->getListeningPorts();
  return ports.empty() ? -1 : ports[0];
}

void HttpServer::Stop() {
  if (server_) server_->close();
}

}  // namespace attnserve::transport
