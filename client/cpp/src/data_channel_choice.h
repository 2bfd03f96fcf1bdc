// Whether a client takes the data channel a server advertises (ServerInfo.data_channel), and
// where it is: shared by attnserve::Client (ClientOptions::transport) and the tools'
// --transport, so both choose alike.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/client.h"
#include "attnserve/data_channel_client.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::data_channel {

// ("host", port) of "host:port" or "[v6]:port"; nullopt when it is neither.
std::optional<std::pair<std::string, int>> SplitHostPort(absl::string_view address);
// The one host a gRPC target names ("host:port", "dns:///host:port", "ipv4:a:port"); nullopt
// for several addresses or none (unix sockets, other resolvers).
std::optional<std::string> TargetHost(absl::string_view target);

// Where to open the data channel of the server at `target` (host and port filled in), or
// nullopt for gRPC. The data channel must be exactly as protected as the gRPC channel: TLS on
// both or on neither, so a TLS client never sends its token or tensors in the clear (e.g. to a
// plaintext data port behind a TLS-terminating proxy). kAuto returns nullopt whenever the
// channel cannot be used; kDataChannel then fails with FAILED_PRECONDITION saying why
// ("transport=data: ..."), as it does when the server advertises no channel. With TLS, the
// options carry `client_tls` (the gRPC channel's files), and the name the server's certificate
// must carry: client_tls.server_name, else the target's host as gRPC checks it.
absl::StatusOr<std::optional<DataChannelOptions>> ChooseDataChannel(Transport choice,
                                                                    const std::string& target,
                                                                    const v1::ServerInfo& info,
                                                                    const TlsOptions& client_tls);

}  // namespace attnserve::data_channel
