// TLS settings of attnserve::Client, for its gRPC channel and its data channel alike.
#pragma once

#include <string>

namespace attnserve {

// TLS towards a server started with --tls_cert_file (and, for mTLS, --tls_client_ca_file).
struct TlsOptions {
  bool enabled = false;
  // PEM CA certificates the server's certificate must chain to; empty: the system's roots.
  std::string root_certificates_file;
  // PEM client certificate (chain) and its private key, for servers that require one (mTLS).
  std::string certificate_chain_file;
  std::string private_key_file;
  // The name the server's certificate must carry, when it is not the target's host name.
  std::string server_name;
};

}  // namespace attnserve
