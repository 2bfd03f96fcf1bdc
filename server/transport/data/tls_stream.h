// TLS on the data channel: the server's certificate chain and key (and, for mTLS, its client
// CAs) in one OpenSSL SSL_CTX, the same files and checks as the gRPC and HTTP ports
// (tls/tls_material.h), and a ByteStream per connection over it.
//
// OpenSSL forbids using one SSL object from two threads at once, even SSL_read beside
// SSL_write, and a connection has a reader and a writer thread. So the socket of a TLS stream
// is non-blocking, every SSL call holds the stream's mutex and never blocks, and the threads
// wait for the socket with poll() outside it: the same timeouts as socket_io.h, reads and
// writes still overlapping on the wire.
#pragma once

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/transport/data/byte_stream.h"
#include "server/transport/tls/tls_material.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace attnserve::transport::data {

class TlsServerContext {
 public:
  static absl::StatusOr<std::unique_ptr<TlsServerContext>> Create(const TlsMaterial& material);
  ~TlsServerContext();

  bool mutual() const { return mutual_; }
  // A stream over the connected socket `fd` (which it makes non-blocking; the caller keeps
  // owning and closes it); sends that make no progress for `send_timeout` fail.
  absl::StatusOr<std::unique_ptr<ByteStream>> NewStream(int fd, absl::Duration send_timeout);

 private:
  TlsServerContext(SSL_CTX* ctx, bool mutual) : ctx_(ctx), mutual_(mutual) {}
  SSL_CTX* const ctx_;
  const bool mutual_;
};

class TlsStream final : public ByteStream {
 public:
  TlsStream(int fd, SSL* ssl, absl::Duration send_timeout);
  ~TlsStream() override;

  // The server's side of the handshake; the client's certificate is checked here with mTLS.
  absl::Status Open(absl::Duration timeout) override;
  absl::Status ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                         absl::Duration stall_timeout) override;
  absl::Status SendAll(absl::Span<const iovec> parts) override;

 private:
  // Writes all `size` bytes, a bounded piece per SSL call so the reader is not kept waiting.
  absl::Status Write(const char* data, size_t size);

  const int fd_;
  SSL* const ssl_;
  const absl::Duration send_timeout_;
  std::mutex mu_;  // held by every SSL call on ssl_
};

}  // namespace attnserve::transport::data
