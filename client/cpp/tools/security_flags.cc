#include "tools/security_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(bool, tls, false,
          "Connect with TLS, trusting the system's roots (implied by --tls_ca_file and "
          "--tls_cert_file).");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA certificate(s) the server's certificate must chain to; implies --tls.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM client certificate, for servers that require one (mTLS); needs --tls_key_file.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name the server's certificate must carry, when not the target's host name.");
ABSL_FLAG(std::string, token_file, "",
          "File whose first non-comment line is the bearer token sent on every call (else "
          "$ATTNSERVE_TOKEN, if set).");

namespace attnserve::tools {

absl::Status ApplySecurityFlags(ClientOptions& options) {
  TlsOptions& tls = options.tls;
  tls.root_certificates_file = absl::GetFlag(FLAGS_tls_ca_file);
  tls.certificate_chain_file = absl::GetFlag(FLAGS_tls_cert_file);
  tls.private_key_file = absl::GetFlag(FLAGS_tls_key_file);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  tls.enabled = absl::GetFlag(FLAGS_tls) || !tls.root_certificates_file.empty() ||
                !tls.certificate_chain_file.empty();
  if (tls.certificate_chain_file.empty() != tls.private_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    if (!token.ok()) return token.status();
    options.bearer_token = *std::move(token);
  } else if (const char* token = std::getenv("ATTNSERVE_TOKEN"); token != nullptr) {
    options.bearer_token = token;
  }
  return absl::OkStatus();
}

}  // namespace attnserve::tools
