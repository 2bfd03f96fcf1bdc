#include "tools/transport_choice.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace attnserve::tools {

absl::StatusOr<Transport> ParseTransport(absl::string_view name) {
  if (name == "auto") return Transport::kAuto;
  if (name == "grpc") return Transport::kGrpc;
  if (name == "data") return Transport::kData;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport must be auto, grpc or data, not '", name, "'"));
}

absl::string_view TransportName(Transport transport) {
  switch (transport) {
    case Transport::kAuto:
      return "auto";
    case Transport::kGrpc:
      return "grpc";
    case Transport::kData:
      return "data";
  }
  return "";
}

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
                                                                    bool client_tls) {
  if (choice == Transport::kGrpc) return std::nullopt;
  std::string refusal;
  DataChannelOptions options;
  if (!info.has_data_channel()) {
    refusal = "the server advertises no data channel (ServerInfo.data_channel)";
  } else if (info.data_channel().tls()) {
    refusal = "the server's data channel wants TLS, which this client does not speak";
  } else if (client_tls) {
    refusal = "this client uses TLS and the data channel would carry tensors in the clear";
  } else if (!info.data_channel().address().empty()) {
    auto address = SplitHostPort(info.data_channel().address());
    if (!address) {
      refusal = absl::StrCat("the server advertises data_channel.address '",
                             info.data_channel().address(), "', which is not host:port");
    } else {
      std::tie(options.host, options.port) = *address;
    }
  } else if (std::optional<std::string> host = TargetHost(target);
             host && info.data_channel().port() > 0) {
    options.host = *host;
    options.port = info.data_channel().port();
  } else {
    refusal = absl::StrCat("the target '", target, "' names no single host for the data channel");
  }
  if (refusal.empty()) return options;
  if (choice == Transport::kAuto) return std::nullopt;
  return absl::FailedPreconditionError(absl::StrCat("--transport=data: ", refusal));
}

}  // namespace attnserve::tools
