#include "server/transport/data/frame.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace attnserve::transport::data {
namespace {

constexpr char kReasonPayload[] = "attnserve.dev/data-protocol-violation";

template <typename T>
void Store(T value, char* out) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

template <typename T>
T Load(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return value;
}

std::string TypeName(uint16_t type) {
  return v1::FrameType_IsValid(type) ? v1::FrameType_Name(static_cast<v1::FrameType>(type))
                                     : absl::StrCat(type);
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& header, char out[kFrameHeaderBytes]) {
  Store<uint32_t>(kFrameMagic, out);
  Store<uint16_t>(static_cast<uint16_t>(header.type), out + 4);
  Store<uint16_t>(header.flags, out + 6);
  Store<uint64_t>(header.request_id, out + 8);
  Store<uint64_t>(header.offset, out + 16);
  Store<uint64_t>(header.length, out + 24);
}

absl::StatusOr<FrameHeader> DecodeClientFrameHeader(const char bytes[kFrameHeaderBytes],
                                                     uint64_t max_chunk_bytes) {
  const uint32_t magic = Load<uint32_t>(bytes);
  if (magic != kFrameMagic) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_magic",
                     absl::StrCat("frame magic 0x", absl::Hex(magic), " is not 0x",
                                  absl::Hex(kFrameMagic), " (\"ADP1\")"));
  }
  const uint16_t type = Load<uint16_t>(bytes + 4);
  FrameHeader header;
  header.flags = Load<uint16_t>(bytes + 6);
  header.request_id = Load<uint64_t>(bytes + 8);
  header.offset = Load<uint64_t>(bytes + 16);
  header.length = Load<uint64_t>(bytes + 24);
  if (type != v1::FRAME_HELLO && type != v1::FRAME_REQUEST && type != v1::FRAME_CHUNK &&
      type != v1::FRAME_CANCEL) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_type",
                     absl::StrCat("frame type ", TypeName(type), " is not one a client sends"));
  }
  header.type = static_cast<v1::FrameType>(type);
  if (header.flags != 0) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_header",
                     absl::StrCat("frame flags must be 0, got ", header.flags));
  }
  if (header.type != v1::FRAME_CHUNK && header.offset != 0) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_header",
                     absl::StrCat(TypeName(type), " frame offset must be 0, got ", header.offset));
  }
  switch (header.type) {
    case v1::FRAME_CHUNK:
      if (header.length == 0 || header.length > max_chunk_bytes) {
        return Violation(absl::StatusCode::kInvalidArgument, "chunk_length",
                         absl::StrCat("CHUNK length ", header.length, " is not in 1..",
                                      max_chunk_bytes, " (max_chunk_bytes)"));
      }
      break;
    case v1::FRAME_CANCEL:
      if (header.length != 0) {
        return Violation(absl::StatusCode::kInvalidArgument, "bad_header",
                         absl::StrCat("CANCEL carries no payload, got length ", header.length));
      }
      break;
    default:
      if (header.length > kMaxMessagePayloadBytes) {
        return Violation(absl::StatusCode::kInvalidArgument, "oversize_message",
                         absl::StrCat(TypeName(type), " payload of ", header.length,
                                      " bytes exceeds the ", kMaxMessagePayloadBytes,
                                      "-byte limit of message frames"));
      }
  }
  return header;
}

absl::Status Violation(absl::StatusCode code, const std::string& reason,
                       const std::string& message) {
  absl::Status status(code, message);
  status.SetPayload(kReasonPayload, absl::Cord(reason));
  return status;
}

std::string ViolationReason(const absl::Status& status) {
  const auto reason = status.GetPayload(kReasonPayload);
  return reason.has_value() ? std::string(*reason) : "other";
}

}  // namespace attnserve::transport::data
