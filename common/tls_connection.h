// TLS over a data channel connection, for both of its ends (the server's
// server/transport/data/tls_stream.h and the C++ client's DataConnection): an OpenSSL SSL
// object over a connected socket that a reader thread and a writer thread use at once.
//
// OpenSSL forbids using one SSL object from two threads at once, even SSL_read beside
// SSL_write, and a connection has a reader and a writer thread. So the socket is non-blocking,
// every SSL call holds the connection's mutex and never blocks, and the threads wait for the
// socket with poll() outside it: reads and writes still overlap on the wire.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

typedef struct ssl_st SSL;

namespace attnserve::tls {

// OpenSSL's socket BIO writes with write(), not send(MSG_NOSIGNAL): a peer that resets the
// connection would raise SIGPIPE and end the process. Ignores SIGPIPE once per process.
void IgnoreSigpipe();

// Why an SSL call failed with `error` (SSL_get_error's), from this thread's OpenSSL error
// queue or `saved_errno`, which the call left there.
std::string Failure(int error, int saved_errno);

class TlsConnection {
 public:
  // Over the connected socket `fd`, which it makes non-blocking (the caller keeps owning and
  // closes it); owns `ssl` (set up for `fd` and for its side: SSL_set_accept_state or
  // SSL_set_connect_state).
  static absl::StatusOr<std::unique_ptr<TlsConnection>> Create(int fd, SSL* ssl);
  ~TlsConnection();
  TlsConnection(const TlsConnection&) = delete;
  TlsConnection& operator=(const TlsConnection&) = delete;

  // The handshake, within `timeout`. On timeout: DEADLINE_EXCEEDED with `late`; on failure:
  // UNAVAILABLE "TLS handshake failed: <why>", with "(<peer_certificate>: <verify error>)"
  // when the peer's certificate was refused.
  absl::Status Handshake(absl::Duration timeout, absl::string_view late,
                         absl::string_view peer_certificate);
  // Reads exactly `size` bytes; the first may take `first_byte_timeout`, each later one
  // `stall_timeout` (InfiniteDuration: for ever). UNAVAILABLE when the peer closed or the
  // connection failed, DEADLINE_EXCEEDED on a timeout.
  absl::Status ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                         absl::Duration stall_timeout);
  // `parts` laid end to end; headers and small payloads are gathered into one record. A send
  // that makes no progress for `send_timeout` fails.
  absl::Status SendAll(absl::Span<const iovec> parts, absl::Duration send_timeout);

 private:
  TlsConnection(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  // Writes all `size` bytes, a bounded piece per SSL call so the reader is not kept waiting.
  absl::Status Write(const char* data, size_t size, absl::Duration send_timeout);

  const int fd_;
  SSL* const ssl_;
  std::mutex mu_;  // held by every SSL call on ssl_
};

}  // namespace attnserve::tls
