#include "server/transport/data/tls_stream.h"

#include <openssl/ssl.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::transport::data {

absl::StatusOr<std::unique_ptr<TlsServerContext>> TlsServerContext::Create(
    const TlsMaterial& material) {
  tls::IgnoreSigpipe();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("data channel TLS: SSL_CTX_new failed: ",
                                            tls::Failure(SSL_ERROR_SSL, 0)));
  }
  std::unique_ptr<TlsServerContext> context(new TlsServerContext(ctx, material.mutual()));
  if (absl::Status s = ConfigureServerSslContext(ctx, material); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("data channel TLS: ", s.message()));
  }
  // Frames carry their own lengths, so a close without close_notify cannot truncate one
  // unnoticed; clients that just close their sockets end as cleanly as over plain TCP.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Clients open a fresh session per connection and never resume one.
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return context;
}

TlsServerContext::~TlsServerContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::unique_ptr<ByteStream>> TlsServerContext::NewStream(
    int fd, absl::Duration send_timeout) {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::ResourceExhaustedError(absl::StrCat("data channel TLS: SSL_new failed: ",
                                                     tls::Failure(SSL_ERROR_SSL, 0)));
  }
  SSL_set_accept_state(ssl);
  absl::StatusOr<std::unique_ptr<tls::TlsConnection>> connection =
      tls::TlsConnection::Create(fd, ssl);
  if (!connection.ok()) return connection.status();
  return std::make_unique<TlsStream>(*std::move(connection), send_timeout);
}

absl::Status TlsStream::Open(absl::Duration timeout) {
  return connection_->Handshake(
      timeout, "the TLS handshake did not finish within the HELLO timeout (a plaintext client?)",
      "client certificate");
}

}  // namespace attnserve::transport::data
