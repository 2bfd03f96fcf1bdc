// The Authenticator applied to a gRPC call: its "authorization" metadata in, a status out.
#pragma once

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/status.h"
#include "server/transport/auth/authenticator.h"

namespace attnserve::transport {

// OK when `auth` is null (open) or accepts the call's credentials; else UNAUTHENTICATED.
absl::Status AuthenticateCall(const Authenticator* auth, const grpc::ServerContextBase& context);

// Who an authenticated call is, for ownership of saved contexts: the SHA-256 of its bearer
// token in hex (never the token itself), or empty when authentication is off. Call after
// AuthenticateCall accepted the call.
std::string CallPrincipal(const Authenticator* auth, const grpc::ServerContextBase& context);

}  // namespace attnserve::transport
