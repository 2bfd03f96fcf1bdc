#include "client/cpp/src/data_channel_tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"

namespace attnserve::data_channel {
namespace {

bool IsIpAddress(const std::string& name) {
  unsigned char address[16];
  return inet_pton(AF_INET, name.c_str(), address) == 1 ||
         inet_pton(AF_INET6, name.c_str(), address) == 1;
}

absl::Status FileError(const char* what, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat("data channel TLS: cannot use the ", what, " ",
                                                 path, ": ", tls::Failure(SSL_ERROR_SSL, 0)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsClientContext>> TlsClientContext::Create(const TlsOptions& tls) {
  tls::IgnoreSigpipe();
  if (tls.certificate_chain_file.empty() != tls.private_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its private key and the other way round");
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("data channel TLS: SSL_CTX_new failed: ",
                                            tls::Failure(SSL_ERROR_SSL, 0)));
  }
  std::unique_ptr<TlsClientContext> context(new TlsClientContext(ctx));
  // As the server's: TLS 1.2 or newer.
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (tls.root_certificates_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return FileError("system's CA certificates", "(default paths)");
    }
  } else if (SSL_CTX_load_verify_locations(ctx, tls.root_certificates_file.c_str(), nullptr) !=
             1) {
    return FileError("TLS CA file", tls.root_certificates_file);
  }
  if (!tls.certificate_chain_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, tls.certificate_chain_file.c_str()) != 1) {
      return FileError("TLS certificate file", tls.certificate_chain_file);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, tls.private_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      return FileError("TLS key file", tls.private_key_file);
    }
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Frames carry their own lengths (see the server's tls_stream.cc).
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return context;
}

TlsClientContext::~TlsClientContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::unique_ptr<tls::TlsConnection>> TlsClientContext::Connect(
    int fd, const std::string& server_name, absl::Duration timeout) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::ResourceExhaustedError(absl::StrCat("data channel TLS: SSL_new failed: ",
                                                     tls::Failure(SSL_ERROR_SSL, 0)));
  }
  // The name is checked as gRPC checks it: an IP address against the certificate's IP
  // addresses, a DNS name against its DNS names (and sent as SNI).
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  const bool named = IsIpAddress(server_name)
                         ? X509_VERIFY_PARAM_set1_ip_asc(param, server_name.c_str()) == 1
                         : SSL_set1_host(ssl, server_name.c_str()) == 1 &&
                               SSL_set_tlsext_host_name(ssl, server_name.c_str()) == 1;
  if (server_name.empty() || !named) {
    SSL_free(ssl);
    return absl::InvalidArgumentError(
        absl::StrCat("data channel TLS: cannot check the server's name '", server_name, "'"));
  }
  SSL_set_connect_state(ssl);
  absl::StatusOr<std::unique_ptr<tls::TlsConnection>> connection =
      tls::TlsConnection::Create(fd, ssl);
  if (!connection.ok()) return connection.status();
  if (absl::Status s = (*connection)
                           ->Handshake(timeout, "the TLS handshake did not finish in time",
                                       "server certificate");
      !s.ok()) {
    return s;
  }
  return connection;
}

}  // namespace attnserve::data_channel
