#include "client/cpp/src/data_channel_choice.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace attnserve::data_channel {

// The protocol version this client speaks (DataHello.protocol_version).
constexpr uint32_t kProtocolVersion = 1;

std::optional<std::pair<std::string, int>> SplitHostPort(absl::string_view address) {
  absl::string_view host, port;
  if (absl::ConsumePrefix(&address, "[")) {
    const size_t close = address.find("]:");
    if (close == absl::string_view::npos) return std::nullopt;
    host = address.substr(0, close);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return std::nullopt;
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  int number = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return std::nullopt;
  }
  return std::make_pair(std::string(host), number);
}

std::optional<std::string> TargetHost(absl::string_view target) {
  bool schemed = false;
  for (absl::string_view prefix : {"dns:///", "ipv4:", "ipv6:", "dns:"}) {
    if (absl::ConsumePrefix(&target, prefix)) {
      schemed = true;
      break;
    }
  }
  if (!schemed && (absl::StrContains(target, ":/") || absl::StartsWith(target, "unix:"))) {
    return std::nullopt;
  }
  if (absl::StrContains(target, ",") || absl::StrContains(target, "/")) return std::nullopt;
  if (auto parsed = SplitHostPort(target)) return parsed->first;
  if (!target.empty() && !absl::StrContains(target, ":")) return std::string(target);
  return std::nullopt;
}

absl::StatusOr<std::optional<DataChannelOptions>> ChooseDataChannel(Transport choice,
                                                                    const std::string& target,
                                                                    const v1::ServerInfo& info,
                                                                    const TlsOptions& client_tls) {
  if (choice == Transport::kGrpc) return std::nullopt;
  std::string refusal;
  DataChannelOptions options;
  const v1::DataChannelInfo& advertised = info.data_channel();
  if (!info.has_data_channel()) {
    refusal = "the server advertises no data channel (ServerInfo.data_channel)";
  } else if (advertised.protocol_version() != kProtocolVersion) {
    refusal = absl::StrCat("the server's data channel speaks protocol version ",
                           advertised.protocol_version(), "; this client speaks ",
                           kProtocolVersion);
  } else if (advertised.tls() && !client_tls.enabled) {
    refusal = "the server's data channel wants TLS and this client uses none";
  } else if (client_tls.enabled && !advertised.tls()) {
    refusal = "this client uses TLS and the data channel would carry tensors in the clear";
  } else if (!advertised.address().empty()) {
    auto address = SplitHostPort(advertised.address());
    if (!address) {
      refusal = absl::StrCat("the server advertises data_channel.address '",
                             advertised.address(), "', which is not host:port");
    } else {
      std::tie(options.host, options.port) = *address;
    }
  } else if (std::optional<std::string> host = TargetHost(target);
             host && advertised.port() > 0) {
    options.host = *host;
    options.port = advertised.port();
  } else {
    refusal = absl::StrCat("the target '", target, "' names no single host for the data channel");
  }
  if (refusal.empty()) {
    if (advertised.tls()) {
      options.tls = client_tls;
      // The name gRPC checks: the override, else the target's host (the data channel's own
      // address may be a pod's IP that the certificate does not name).
      if (options.tls.server_name.empty()) {
        options.tls.server_name = TargetHost(target).value_or(options.host);
      }
    }
    return options;
  }
  if (choice == Transport::kAuto) return std::nullopt;
  return absl::FailedPreconditionError(absl::StrCat("transport=data: ", refusal));
}

}  // namespace attnserve::data_channel
