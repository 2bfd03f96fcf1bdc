// --transport for the tools (attnctl, attnload): gRPC, or the bulk data channel a server
// advertises in ServerInfo.data_channel (proto/attnserve/v1/data_channel.proto).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/data_channel_client.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::tools {

// kAuto: the data channel when the server offers one this client can speak, else gRPC.
enum class Transport { kAuto, kGrpc, kData };
absl::StatusOr<Transport> ParseTransport(absl::string_view name);
absl::string_view TransportName(Transport transport);

// ("host", port) of "host:port" or "[v6]:port"; nullopt when it is neither.
std::optional<std::pair<std::string, int>> SplitHostPort(absl::string_view address);
// The one host a gRPC target names ("host:port", "dns:///host:port", "ipv4:a:port"); nullopt
// for several addresses or none (unix sockets, other resolvers).
std::optional<std::string> TargetHost(absl::string_view target);

// Where to open the data channel of the server at `target` (host and port filled in), or
// nullopt for gRPC. The C++ data channel client speaks plain TCP only, so a server whose data
// channel wants TLS, or a client that uses TLS on gRPC, stays on gRPC under kAuto; kData then
// fails with FAILED_PRECONDITION naming why, as it does when the server advertises no channel.
absl::StatusOr<std::optional<DataChannelOptions>> ChooseDataChannel(Transport choice,
                                                                    const std::string& target,
                                                                    const v1::ServerInfo& info,
                                                                    bool client_tls);

}  // namespace attnserve::tools
