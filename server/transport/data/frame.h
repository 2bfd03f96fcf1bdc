// The data channel's frame header (proto/attnserve/v1/data_channel.proto has the spec): 32
// little-endian bytes in front of every frame. Decoding checks everything a header alone can
// tell; what depends on a request (chunk ranges, ids) is checked by its session.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/data_channel.pb.h"
#include "common/data_channel_wire.h"

namespace attnserve::transport::data {

inline constexpr uint32_t kFrameMagic = data_channel_wire::kMagic;
inline constexpr size_t kFrameHeaderBytes = data_channel_wire::kHeaderBytes;
inline constexpr uint32_t kProtocolVersion = 1;
// HELLO, REQUEST, ACCEPTED, RESPONSE and ERROR payloads (protobuf messages) are at most this.
inline constexpr uint64_t kMaxMessagePayloadBytes = uint64_t{1} << 20;
// The largest payload a REQUEST may send without waiting for ACCEPTED (inline_payload): a
// 512-token forward of 16 heads of 128 in bf16 is 6.3 MB, which otherwise waits a round trip
// for ACCEPTED and then starts a sender thread per connection in the C++ client.
inline constexpr int64_t kMaxInlineBytes = int64_t{8} << 20;
// The smallest chunk_bytes a request may choose.
inline constexpr int64_t kMinChunkBytes = int64_t{64} << 10;

struct FrameHeader {
  v1::FrameType type = v1::FRAME_UNSPECIFIED;
  uint16_t flags = 0;
  uint64_t request_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

void EncodeFrameHeader(const FrameHeader& header, char out[kFrameHeaderBytes]);

// The header of a frame a client sent: the magic, flags 0, a type clients send (HELLO,
// REQUEST, CHUNK, CANCEL), offset 0 except on CHUNKs, a message payload of at most
// kMaxMessagePayloadBytes, a CHUNK of 1..max_chunk_bytes, an empty CANCEL. Errors are protocol
// violations (see ViolationReason).
absl::StatusOr<FrameHeader> DecodeClientFrameHeader(const char bytes[kFrameHeaderBytes],
                                                     uint64_t max_chunk_bytes);

// A protocol violation: `code` and `message` go to the peer in an ERROR frame, `reason` labels
// attnserve_data_protocol_errors_total.
absl::Status Violation(absl::StatusCode code, const std::string& reason,
                       const std::string& message);
// The reason Violation attached; "other" for any other status.
std::string ViolationReason(const absl::Status& status);

}  // namespace attnserve::transport::data
