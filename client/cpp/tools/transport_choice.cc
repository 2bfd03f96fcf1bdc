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

absl::StatusOr<SharedMemory> ParseSharedMemory(absl::string_view name) {
  if (name == "off") return SharedMemory::kOff;
  if (name == "auto") return SharedMemory::kAuto;
  if (name == "on") return SharedMemory::kOn;
  return absl::InvalidArgumentError(
      absl::StrCat("--shared_memory must be off, auto or on, not '", name, "'"));
}

absl::string_view SharedMemoryName(SharedMemory choice) {
  switch (choice) {
    case SharedMemory::kOff:
      return "off";
    case SharedMemory::kAuto:
      return "auto";
    case SharedMemory::kOn:
      return "on";
  }
  return "";
}

}  // namespace attnserve::tools
