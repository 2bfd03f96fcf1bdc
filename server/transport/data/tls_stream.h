// TLS on the data channel: the server's certificate chain and key (and, for mTLS, its client
// CAs) in one OpenSSL SSL_CTX, the same files and checks as the gRPC and HTTP ports
// (tls/tls_material.h), and a ByteStream per connection over it. The connection itself (one
// reader and one writer thread on one SSL object) is common/tls_connection.h, which the C++
// client's data channel shares.
#pragma once

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls_connection.h"
#include "server/transport/data/byte_stream.h"
#include "server/transport/tls/tls_material.h"

typedef struct ssl_ctx_st SSL_CTX;

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
  TlsStream(std::unique_ptr<tls::TlsConnection> connection, absl::Duration send_timeout)
      : connection_(std::move(connection)), send_timeout_(send_timeout) {}

  // The server's side of the handshake; the client's certificate is checked here with mTLS.
  absl::Status Open(absl::Duration timeout) override;
  absl::Status ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                         absl::Duration stall_timeout) override {
    return connection_->ReadExact(out, size, first_byte_timeout, stall_timeout);
  }
  absl::Status SendAll(absl::Span<const iovec> parts) override {
    return connection_->SendAll(parts, send_timeout_);
  }

 private:
  const std::unique_ptr<tls::TlsConnection> connection_;
  const absl::Duration send_timeout_;
};

}  // namespace attnserve::transport::data
