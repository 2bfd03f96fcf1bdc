// The server's TLS files, read and checked once at startup so a missing, unreadable or
// mismatched file fails with a message naming it, and both ports (gRPC and HTTP) serve the very
// same bytes.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnserve::transport {

struct TlsFiles {
  std::string cert_file;       // PEM: the server certificate, then any intermediates
  std::string key_file;        // PEM: its private key (unencrypted)
  std::string client_ca_file;  // PEM: CAs that sign client certificates; set = mTLS
};

struct TlsMaterial {
  std::string cert_chain_pem;
  std::string private_key_pem;
  std::string client_ca_pem;  // empty: client certificates are neither asked for nor checked
  bool mutual() const { return !client_ca_pem.empty(); }
};

// Reads the files and checks that the chain and CAs hold certificates and that the key is the
// certificate's.
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsFiles& files);

// Sets up an OpenSSL SSL_CTX (passed as void* so callers need no OpenSSL headers) to serve
// `material`: TLS 1.2 or newer, and with a client CA, client certificates required and
// verified against it.
absl::Status ConfigureServerSslContext(void* ssl_ctx, const TlsMaterial& material);

}  // namespace attnserve::transport
