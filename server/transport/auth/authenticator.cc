#include "server/transport/auth/authenticator.h"

#include <openssl/sha.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
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

std::string Authenticator::Principal(std::optional<absl::string_view> authorization) const {
  if (tokens_ == nullptr || !authorization.has_value()) return "";
  // The token after the "Bearer " scheme that Check accepted.
  const absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  constexpr size_t kSchemeSize = 7;
  const absl::string_view token =
      absl::StripLeadingAsciiWhitespace(value.substr(std::min(kSchemeSize, value.size())));
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

}  // namespace attnserve::transport
