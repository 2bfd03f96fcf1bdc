// libFuzzer target: raw bytes (any method, path, headers, body) sent to the real HttpServer on
// a loopback port, started once per process over a CPU engine. Each input gets its own
// connection; after writing it the fuzzer half-closes, so a server that neither answers nor
// closes within kReplyTimeout counts as hung, and one that stops accepting as crashed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "server/devices/device_registry.h"
#include "server/engine/local_engine.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/http/http_server.h"

namespace {

constexpr int kReplyTimeoutSeconds = 5;

struct Fixture {
  std::unique_ptr<attnserve::metrics::ServerMetrics> metrics;
  std::unique_ptr<attnserve::engine::LocalEngine> engine;
  std::unique_ptr<attnserve::transport::HttpServer> http;
};

Fixture* StartServer() {
  auto* fixture = new Fixture();
  fixture->metrics = std::make_unique<attnserve::metrics::ServerMetrics>("fuzz");
  auto devices = attnserve::devices::ResolveDevices("cpu", attnserve::devices::ListNoGpus);
  attnserve::engine::EngineOptions options;
  options.cpu_threads = 1;
  auto engine = attnserve::engine::LocalEngine::Create(*devices, options, fixture->metrics.get());
  if (!engine.ok()) std::abort();
  fixture->engine = *std::move(engine);
  attnserve::transport::HttpServerOptions http_options;
  http_options.host = "127.0.0.1";
  http_options.port = 0;
  http_options.num_threads = 2;
  http_options.version = "fuzz";
  // Well under kReplyTimeoutSeconds: a connection the server keeps past this is a hang.
  http_options.request_timeout_ms = 1000;
  auto http = attnserve::transport::HttpServer::Start(http_options, fixture->engine.get(),
                                                     fixture->metrics.get(), [] { return true; });
  if (!http.ok()) std::abort();
  fixture->http = *std::move(http);
  return fixture;
}

int ConnectOnce(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{kReplyTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  // Each connection ends in TIME_WAIT on our side for a minute; at thousands a second one
  // source address would run out of ephemeral ports, so they rotate over 127.1.0.0/16.
  static uint32_t next_source = 0;
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl(0x7f010000u | (next_source++ & 0xffffu));
  bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  const int error = errno;
  close(fd);
  errno = error;
  return -1;
}

int Connect(int port) {
  // libFuzzer's own timers deliver signals; a connect they interrupt (EINTR) is retried on a
  // fresh socket rather than taken for a server that stopped accepting.
  constexpr int kAttempts = 5;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const int fd = ConnectOnce(port);
    if (fd >= 0) return fd;
    if (errno != EINTR) break;
  }
  std::fprintf(stderr, "http_fuzzer: the HTTP server stopped accepting connections: %s\n",
               std::strerror(errno));
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Leaked on purpose: server threads must outlive every input, and exit needs no teardown.
  static Fixture* fixture = StartServer();
  const int fd = Connect(fixture->http->port());
  // The server may answer and close before reading everything (e.g. an oversized header), so
  // a failed write is not an error; MSG_NOSIGNAL keeps that from raising SIGPIPE.
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char reply[4096];
  for (;;) {
    const ssize_t n = recv(fd, reply, sizeof(reply), 0);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::fprintf(stderr, "http_fuzzer: no reply and no close within %d s\n",
                   kReplyTimeoutSeconds);
      std::abort();
    }
    break;  // closed (or reset)
  }
  close(fd);
  return 0;
}
