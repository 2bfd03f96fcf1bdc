// Checks a call's credentials (the "authorization: Bearer <token>" gRPC metadata or HTTP
// header) against the TokenStore, counting refusals by reason. The one place both transports
// decide who may call; their handlers turn the status into a gRPC status or HTTP 401.
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/token_store.h"

namespace attnserve::transport {

class Authenticator {
 public:
  // `tokens` null: authentication is off and every check passes. Both must outlive this.
  Authenticator(const TokenStore* tokens, metrics::ServerMetrics* metrics);

  bool enabled() const { return tokens_ != nullptr; }
  // `authorization` is the value sent, absent when none was. UNAUTHENTICATED with a message
  // that says what was wrong (never echoing what was sent) when the call may not proceed.
  absl::Status Check(std::optional<absl::string_view> authorization) const;
  // Who a caller that Check accepted is, for ownership of saved contexts: the SHA-256 of its
  // bearer token in hex (never the token itself); empty when authentication is off.
  std::string Principal(std::optional<absl::string_view> authorization) const;

 private:
  const TokenStore* const tokens_;
  metrics::ServerMetrics* const metrics_;
};

}  // namespace attnserve::transport
