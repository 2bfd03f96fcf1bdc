#include "server/transport/grpc/call_auth.h"

#include <openssl/sha.h>

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"

namespace attnserve::transport {

absl::Status AuthenticateCall(const Authenticator* auth,
                              const grpc::ServerContextBase& context) {
  if (auth == nullptr) return absl::OkStatus();
  // gRPC lower-cases metadata keys; a repeated key is read at its first value.
  std::optional<absl::string_view> authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  return auth->Check(authorization);
}

std::string CallPrincipal(const Authenticator* auth, const grpc::ServerContextBase& context) {
  if (auth == nullptr || !auth->enabled()) return "";
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  // The token after the "Bearer " scheme that AuthenticateCall checked.
  absl::string_view value =
      absl::StripAsciiWhitespace(absl::string_view(it->second.data(), it->second.size()));
  constexpr size_t kSchemeSize = 7;
  const absl::string_view token =
      absl::StripLeadingAsciiWhitespace(value.substr(std::min(kSchemeSize, value.size())));
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

}  // namespace attnserve::transport
