#include "server/transport/data/data_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/transport/data/connection.h"
#include "server/transport/data/out_frame.h"
#include "server/transport/data/session.h"
#include "server/transport/data/socket_io.h"

namespace attnserve::transport::data {
namespace {

// How long the accept loop backs off when the process or system is out of descriptors (or
// memory): the pending connection stays in the backlog and is tried again, the loop lives on.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);
// How often transfer deadlines are checked.
constexpr absl::Duration kReapInterval = absl::Milliseconds(250);
constexpr int kListenBacklog = 256;
// Failed TLS handshakes (scanners, clients with the wrong certificate) are logged at most this
// often.
constexpr absl::Duration kHandshakeReportInterval = absl::Seconds(10);

absl::StatusOr<int> Listen(const DataServerOptions& options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (int rc = getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("data channel host '", options.host,
                                                   "': ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // Set before listen() so accepted sockets inherit them and the window scale they imply.
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &options.socket_buffer_bytes,
               sizeof(options.socket_buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &options.socket_buffer_bytes,
               sizeof(options.socket_buffer_bytes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, kListenBacklog) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(
      absl::StrCat("data channel could not listen on ", options.host, ":", options.port, ": ", error));
}

int BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

// A connection over --data_max_connections gets an ERROR frame, if its socket takes it at
// once, and is closed.
void Refuse(int fd, const absl::Status& status) {
  const OutFrame frame = ErrorFrame(status);
  std::string bytes(frame.header, kFrameHeaderBytes);
  bytes += frame.message;
  (void)send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  close(fd);
}

}  // namespace

DataServer::DataServer(const DataServerOptions& options, metrics::ServerMetrics* metrics)
    : registry_(metrics->registry()),
      data_metrics_(*registry_),
      budget_(options.max_buffered_bytes, &data_metrics_) {
  context_.options = options;
  context_.metrics = metrics;
  context_.data_metrics = &data_metrics_;
  context_.budget = &budget_;
  data_metrics_.SetBufferedBytesLimit(static_cast<double>(options.max_buffered_bytes));
}

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Start(
    const DataServerOptions& options, engine::Engine* engine, metrics::ServerMetrics* metrics,
    CallSlots* slots, const Authenticator* auth, const TlsMaterial* tls) {
  std::unique_ptr<DataServer> server(new DataServer(options, metrics));
  server->context_.engine = engine;
  server->context_.slots = slots;
  server->context_.auth = auth;
  if (tls != nullptr) {
    absl::StatusOr<std::unique_ptr<TlsServerContext>> context = TlsServerContext::Create(*tls);
    if (!context.ok()) return context.status();
    server->tls_ = *std::move(context);
  }
  absl::StatusOr<int> fd = Listen(options);
  if (!fd.ok()) return fd.status();
  server->listen_fd_ = *fd;
  server->port_ = BoundPort(*fd);
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  server->reap_thread_ = std::thread([s = server.get()] { s->ReapLoop(); });
  return server;
}

DataServer::~DataServer() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DataServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  absl::Time last_complaint = absl::InfinitePast();
  while (true) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents != 0) break;
    if (fds[0].revents == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Accept(fd);
      continue;
    }
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED || errno == EPROTO) continue;
    // EMFILE, ENFILE, ENOBUFS, ENOMEM: wait for descriptors or memory to come back.
    if (absl::Now() - last_complaint > absl::Seconds(10)) {
      std::fprintf(stderr, "attnserve: data channel accept failed (%s); retrying\n",
                   std::strerror(errno));
      last_complaint = absl::Now();
    }
    absl::SleepFor(kAcceptBackoff);
  }
}

void DataServer::Accept(int fd) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_connections_ >= context_.options.max_connections) {
      data_metrics_.RecordProtocolError("connection_limit");
      if (tls_ == nullptr) {
        Refuse(fd, absl::ResourceExhaustedError(absl::StrCat(
                       "the server already has data_max_connections = ",
                       context_.options.max_connections, " data channel connections")));
      } else {
        close(fd);  // a TLS client could not read a plaintext ERROR; it sees the close
      }
      return;
    }
    ++open_connections_;
  }
  data_metrics_.AddConnections(1);
  ConfigureConnectedSocket(fd, context_.options.socket_buffer_bytes,
                           context_.options.transfer_timeout);
  std::unique_ptr<ByteStream> stream = std::make_unique<PlainStream>(fd);
  if (tls_ != nullptr) {
    absl::StatusOr<std::unique_ptr<ByteStream>> tls =
        tls_->NewStream(fd, context_.options.transfer_timeout);
    if (!tls.ok()) {
      std::fprintf(stderr, "attnserve: data channel connection dropped: %s\n",
                   std::string(tls.status().message()).c_str());
      close(fd);
      ConnectionClosed();
      return;
    }
    stream = *std::move(tls);
  }
  auto connection = std::make_shared<Connection>(fd, std::move(stream), this, &context_);
  try {
    connection->Start();
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "attnserve: data channel connection dropped: %s\n", e.what());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                    [](const std::weak_ptr<Connection>& c) { return c.expired(); }),
                     connections_.end());
  connections_.push_back(connection);
}

void DataServer::ReapLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    cv_.wait_for(lock, absl::ToChronoMicroseconds(kReapInterval));
    std::vector<std::shared_ptr<Session>> sessions;
    for (const auto& [id, session] : sessions_) sessions.push_back(session);
    lock.unlock();
    const absl::Time now = absl::Now();
    for (const std::shared_ptr<Session>& session : sessions) session->ExpireTransfers(now);
    lock.lock();
  }
}

absl::StatusOr<std::shared_ptr<Session>> DataServer::JoinSession(
    const std::string& id, const std::string& principal, std::shared_ptr<Connection> connection) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) {
    // The session id is the client's secret among clients of one token.
    if (context_.auth != nullptr && it->second->principal() != principal) {
      return absl::PermissionDeniedError("this session id belongs to another client's token");
    }
    absl::Status joined = it->second->Join(connection);
    if (joined.ok()) return it->second;
    if (!absl::IsFailedPrecondition(joined)) return joined;
    // It ended as this connection arrived: start it anew (its EndSession finds nothing).
    sessions_.erase(it);
    data_metrics_.AddSessions(-1);
  }
  auto session = std::make_shared<Session>(id, principal, &context_);
  if (absl::Status joined = session->Join(std::move(connection)); !joined.ok()) return joined;
  sessions_.emplace(id, session);
  data_metrics_.AddSessions(1);
  return session;
}

void DataServer::EndSession(const std::shared_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second == session) {
      sessions_.erase(it);
      data_metrics_.AddSessions(-1);
      return;
    }
  }
}

void DataServer::ConnectionClosed() {
  data_metrics_.AddConnections(-1);
  std::lock_guard<std::mutex> lock(mu_);
  --open_connections_;
}

void DataServer::ThreadStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++live_threads_;
}

void DataServer::ThreadExited() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--live_threads_ == 0) cv_.notify_all();
}

void DataServer::HandshakeFailed(const absl::Status& why) {
  int64_t unreported;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++unreported_handshake_failures_;
    const absl::Time now = absl::Now();
    if (now - last_handshake_report_ < kHandshakeReportInterval) return;
    last_handshake_report_ = now;
    unreported = unreported_handshake_failures_;
    unreported_handshake_failures_ = 0;
  }
  std::string line = absl::StrCat("attnserve: data channel: ", why.message());
  if (unreported > 1) {
    absl::StrAppend(&line, " (", unreported, " failed handshakes since the last report)");
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

void DataServer::StopAccepting() {
  context_.refusing = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) return;
    accepting_ = false;
  }
  const uint64_t one = 1;
  (void)write(wake_fd_, &one, sizeof(one));
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  listen_fd_ = -1;
}

bool DataServer::WaitForCalls(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(context_.calls_mu);
  return context_.calls_cv.wait_for(lock, absl::ToChronoMicroseconds(timeout),
                                    [this] { return context_.calls == 0; });
}

void DataServer::Stop() {
  StopAccepting();
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    for (const std::weak_ptr<Connection>& c : connections_) {
      if (std::shared_ptr<Connection> connection = c.lock()) open.push_back(connection);
    }
  }
  cv_.notify_all();
  if (reap_thread_.joinable()) reap_thread_.join();
  for (const std::shared_ptr<Connection>& connection : open) connection->Shutdown();
  open.clear();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return live_threads_ == 0; });
}

}  // namespace attnserve::transport::data
