// The TLS and bearer-token flags attnctl and attnload share: --tls_ca_file, --tls_cert_file,
// --tls_key_file, --tls_server_name, --tls, --token_file (else $ATTNSERVE_TOKEN).
#pragma once

#include "absl/status/status.h"
#include "attnserve/client.h"

namespace attnserve::tools {

// Sets `options`' tls and bearer_token from the flags and environment; fails (naming the flag)
// on inconsistent flags or an unreadable token file.
absl::Status ApplySecurityFlags(ClientOptions& options);

}  // namespace attnserve::tools
