#include "server/transport/data/frame.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace attnserve::transport::data {
namespace {

constexpr char kReasonPayload[] = "attnserve.dev/data-protocol-violation";

std::string TypeName(uint16_t type) {
  return v1::FrameType_IsValid(type) ? v1::FrameType_Name(static_cast<v1::FrameType>(type))
                                     : absl::StrCat(type);
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& header, char out[kFrameHeaderBytes]) {
  data_channel_wire::RawHeader raw;
  raw.type = static_cast<uint16_t>(header.type);
  raw.flags = header.flags;
  raw.request_id = header.request_id;
  raw.offset = header.offset;
  raw.length = header.length;
  data_channel_wire::EncodeHeader(raw, out);
}

absl::StatusOr<FrameHeader> DecodeClientFrameHeader(const char bytes[kFrameHeaderBytes],
                                                     uint64_t max_chunk_bytes) {
  const data_channel_wire::RawHeader raw = data_channel_wire::DecodeHeader(bytes);
  const uint32_t magic = raw.magic;
  if (magic != kFrameMagic) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_magic",
                     absl::StrCat("frame magic 0x", absl::Hex(magic), " is not 0x",
                                  absl::Hex(kFrameMagic), " (\"ADP1\")"));
  }
  const uint16_t type = raw.type;
  FrameHeader header;
  header.flags = raw.flags;
  header.request_id = raw.request_id;
  header.offset = raw.offset;
  header.length = raw.length;
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
