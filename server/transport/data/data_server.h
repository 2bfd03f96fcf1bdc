// The bulk data path's listener (proto/attnserve/v1/data_channel.proto is the protocol):
// raw TCP connections grouped into sessions, request payloads received by offset straight
// into their receive buffers, calls run through the same engine, slots and tokens as the
// gRPC service, responses sent from the result's own bytes.
//
// Threading: one reader and one writer thread per connection, blocking sockets with poll()
// and send timeouts. The path serves few, fat connections (a client opens 1..16 to move
// hundreds of megabytes); a blocking recv() into the request's buffer and a blocking
// sendmsg() of the result's bytes are the fewest copies and syscalls per byte, and a thread
// that blocks costs nothing while its peer is slow. Connections are capped
// (--data_max_connections), so the thread count is too.
//
// TLS: with the server's TLS material every connection starts with a TLS handshake (mTLS
// when it has client CAs), as on the gRPC port; see tls_stream.h for how TLS keeps the
// reader and writer threads.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/metrics/data_metrics.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_slots.h"
#include "server/transport/data/data_context.h"
#include "server/transport/data/tls_stream.h"
#include "server/transport/tls/tls_material.h"

namespace attnserve::transport::data {

class Connection;
class Session;

class DataServer {
 public:
  // Listens on options.host:options.port. Everything passed in must outlive the server;
  // `auth` null: no tokens needed; `tls` null: plain TCP.
  static absl::StatusOr<std::unique_ptr<DataServer>> Start(
      const DataServerOptions& options, engine::Engine* engine, metrics::ServerMetrics* metrics,
      CallSlots* slots, const Authenticator* auth, const TlsMaterial* tls);
  ~DataServer();

  int port() const { return port_; }

  // Draining, first step: no new connections; new REQUESTs are refused with UNAVAILABLE.
  void StopAccepting();
  // Waits until every admitted call has been answered and its response sent (or dropped);
  // whether that happened within `timeout`.
  bool WaitForCalls(absl::Duration timeout);
  // Closes every connection and waits for their threads. Idempotent.
  void Stop();

  // For connections.
  absl::StatusOr<std::shared_ptr<Session>> JoinSession(const std::string& id,
                                                      const std::string& principal,
                                                      std::shared_ptr<Connection> connection);
  void EndSession(const std::shared_ptr<Session>& session);
  void ConnectionClosed();
  void ThreadStarted();
  void ThreadExited();
  // Logs why a connection's TLS handshake failed, at most every few seconds.
  void HandshakeFailed(const absl::Status& why);

 private:
  DataServer(const DataServerOptions& options, metrics::ServerMetrics* metrics);
  void AcceptLoop();
  void Accept(int fd);
  void ReapLoop();

  std::shared_ptr<prometheus::Registry> registry_;
  metrics::DataMetrics data_metrics_;
  BufferBudget budget_;
  DataContext context_;
  std::unique_ptr<TlsServerContext> tls_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that wakes the accept loop to stop
  int port_ = 0;
  std::thread accept_thread_;
  std::thread reap_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  std::vector<std::weak_ptr<Connection>> connections_;
  int64_t open_connections_ = 0;
  int64_t live_threads_ = 0;
  bool accepting_ = true;
  bool stopped_ = false;
  absl::Time last_handshake_report_ = absl::InfinitePast();
  int64_t unreported_handshake_failures_ = 0;
};

}  // namespace attnserve::transport::data
