#include "tools/transport_choice.h"

#include "absl/strings/str_cat.h"

namespace attnserve::tools {

absl::StatusOr<Transport> ParseTransport(absl::string_view name) {
  if (name == "auto") return Transport::kAuto;
  if (name == "grpc") return Transport::kGrpc;
  if (name == "data") return Transport::kDataChannel;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport must be auto, grpc or data, not '", name, "'"));
}

absl::string_view TransportName(Transport transport) {
  switch (transport) {
    case Transport::kAuto:
      return "auto";
    case Transport::kGrpc:
      return "grpc";
    case Transport::kDataChannel:
      return "data";
  }
  return "";
}

}  // namespace attnserve::tools
