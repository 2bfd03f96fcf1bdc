// The ServerInfo message (version, devices, kernel families, limits), shared by the gRPC
// GetServerInfo RPC and the HTTP JSON page.
#pragma once

#include <string>

#include "attnserve/v1/attention.pb.h"
#include "server/engine/engine.h"
#include "server/transport/call_limits.h"

namespace attnserve::transport {

v1::ServerInfo BuildServerInfo(const engine::Engine& engine, const std::string& version,
                               const CallLimits& call_limits);

}  // namespace attnserve::transport
