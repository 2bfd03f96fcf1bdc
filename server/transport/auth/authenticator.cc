#include "server/transport/auth/authenticator.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace attnserve::transport {

Authenticator::Authenticator(const TokenStore* tokens, metrics::ServerMetrics* metrics)
    : tokens_(tokens), metrics_(metrics) {}

absl::Status Authenticator::Check(std::optional<absl::string_view> authorization) const {
  if (tokens_ == nullptr) return absl::OkStatus();
  if (!authorization.has_value()) {
    metrics_->RecordAuthFailure("missing");
    return absl::UnauthenticatedError(
        "this server requires a bearer token: send 'authorization: Bearer <token>'");
  }
  // The scheme is case-insensitive (RFC 7235); the token is everything after it.
  constexpr absl::string_view kScheme = "bearer ";
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  if (!absl::StartsWithIgnoreCase(value, kScheme)) {
    metrics_->RecordAuthFailure("malformed");
    return absl::UnauthenticatedError(
        "the authorization value is not of the form 'Bearer <token>'");
  }
  const absl::string_view token = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  if (token.empty() || !tokens_->Contains(token)) {
    metrics_->RecordAuthFailure("invalid");
    return absl::UnauthenticatedError("the bearer token is not accepted (unknown or revoked)");
  }
  return absl::OkStatus();
}

}  // namespace attnserve::transport
