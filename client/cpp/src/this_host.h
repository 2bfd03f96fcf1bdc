// Whether a gRPC target's host is this machine, as the Python client decides it
// (client/python/attnserve/addresses.py: is_this_host), for the shared-memory path.
#pragma once

#include <string>

namespace attnserve::internal {

// Whether `host` (a target's host, brackets allowed around IPv6) names this machine: a loopback
// address or "localhost" (or a name under ".localhost"), this machine's own name or canonical
// name, or an address this machine's name resolves to. Only this machine's own name is
// resolved, so a remote name never costs a lookup. Only a hint: the server proves it by mapping
// the client's shared memory (one in another container behind a forwarded port cannot).
bool IsThisHost(const std::string& host);

}  // namespace attnserve::internal
