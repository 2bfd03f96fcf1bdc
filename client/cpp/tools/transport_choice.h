// --transport and --shared_memory for the tools (attnctl, attnload): gRPC, or the bulk data channel a server
// advertises in ServerInfo.data_channel (proto/attnserve/v1/data_channel.proto), chosen as
// attnserve::Client chooses (client/cpp/src/data_channel_choice.h).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/client.h"
#include "client/cpp/src/data_channel_choice.h"

namespace attnserve::tools {

using attnserve::SharedMemory;
using attnserve::Transport;
using data_channel::ChooseDataChannel;
using data_channel::SplitHostPort;
using data_channel::TargetHost;

// "auto", "grpc" or "data" (Transport::kDataChannel).
absl::StatusOr<Transport> ParseTransport(absl::string_view name);
absl::string_view TransportName(Transport transport);

// --shared_memory: "off", "auto" or "on" (ClientOptions::shared_memory).
absl::StatusOr<SharedMemory> ParseSharedMemory(absl::string_view name);
absl::string_view SharedMemoryName(SharedMemory choice);

}  // namespace attnserve::tools
