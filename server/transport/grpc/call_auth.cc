#include "server/transport/grpc/call_auth.h"

#include <optional>


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
  if (auth == nullptr) return "";
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return auth->Principal(std::nullopt);
  return auth->Principal(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace attnserve::transport
