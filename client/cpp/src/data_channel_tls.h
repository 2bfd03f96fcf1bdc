// The client's side of TLS on the data channel: the same CA, client certificate and key files
// as the Client's gRPC channel (TlsOptions) in one OpenSSL SSL_CTX per session, and connections
// whose handshake verifies the server's certificate and name. The connection itself is
// common/tls_connection.h, shared with the server.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/tls_options.h"
#include "common/tls_connection.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace attnserve::data_channel {

class TlsClientContext {
 public:
  // Reads the files of `tls`: the CA certificates the server's must chain to (none: the
  // system's roots) and, for mTLS, the client certificate chain and its key. INVALID_ARGUMENT
  // naming the file that cannot be read or used.
  static absl::StatusOr<std::unique_ptr<TlsClientContext>> Create(const TlsOptions& tls);
  ~TlsClientContext();

  // TLS over the connected socket `fd` (made non-blocking; the caller keeps owning it), its
  // handshake done within `timeout`: the server's certificate must chain to the CAs and name
  // `server_name` (a DNS name, or an IP address it must list). UNAVAILABLE "TLS handshake
  // failed: ..." saying why otherwise.
  absl::StatusOr<std::unique_ptr<tls::TlsConnection>> Connect(int fd,
                                                              const std::string& server_name,
                                                              absl::Duration timeout) const;

 private:
  explicit TlsClientContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* const ctx_;
};

}  // namespace attnserve::data_channel
