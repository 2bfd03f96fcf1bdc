#include "server/transport/data/frame.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport::data {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMaxChunk = 1 << 20;

std::string Encode(const FrameHeader& header) {
  std::string bytes(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(header, bytes.data());
  return bytes;
}

FrameHeader Header(v1::FrameType type, uint64_t length, uint64_t offset = 0) {
  FrameHeader header;
  header.type = type;
  header.request_id = 0x0102030405060708;
  header.offset = offset;
  header.length = length;
  return header;
}

TEST(FrameTest, HeaderIsLittleEndianWithMagicFirst) {
  const std::string bytes = Encode(Header(v1::FRAME_CHUNK, 0x10, 0x20));
  EXPECT_EQ(bytes.substr(0, 4), "ADP1");
  EXPECT_EQ(bytes[4], 5);  // FRAME_CHUNK
  EXPECT_EQ(bytes[5], 0);
  EXPECT_EQ(bytes[8], 0x08);
  EXPECT_EQ(bytes[15], 0x01);
  EXPECT_EQ(bytes[16], 0x20);
  EXPECT_EQ(bytes[24], 0x10);
}

TEST(FrameTest, RoundTripsEveryClientFrame) {
  for (const FrameHeader& sent :
       {Header(v1::FRAME_HELLO, 40), Header(v1::FRAME_REQUEST, kMaxMessagePayloadBytes),
        Header(v1::FRAME_CHUNK, kMaxChunk, uint64_t{1} << 40), Header(v1::FRAME_CANCEL, 0)}) {
    absl::StatusOr<FrameHeader> got = DecodeClientFrameHeader(Encode(sent).data(), kMaxChunk);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->type, sent.type);
    EXPECT_EQ(got->request_id, sent.request_id);
    EXPECT_EQ(got->offset, sent.offset);
    EXPECT_EQ(got->length, sent.length);
  }
}

struct BadHeader {
  std::string bytes;
  std::string reason;
  std::string message;
};

TEST(FrameTest, RefusesBrokenHeadersNamingTheProblem) {
  std::string bad_magic = Encode(Header(v1::FRAME_HELLO, 1));
  bad_magic[0] = 'X';
  std::string flags = Encode(Header(v1::FRAME_HELLO, 1));
  flags[6] = 1;
  std::string unknown_type = Encode(Header(v1::FRAME_HELLO, 1));
  unknown_type[4] = 42;
  const std::vector<BadHeader> cases = {
      {bad_magic, "bad_magic", "magic"},
      {flags, "bad_header", "flags must be 0"},
      {unknown_type, "bad_type", "frame type 42"},
      {Encode(Header(v1::FRAME_RESPONSE, 1)), "bad_type", "FRAME_RESPONSE is not one a client"},
      {Encode(Header(v1::FRAME_REQUEST, kMaxMessagePayloadBytes + 1)), "oversize_message",
       "1048576-byte limit"},
      {Encode(Header(v1::FRAME_REQUEST, 10, 5)), "bad_header", "offset must be 0"},
      {Encode(Header(v1::FRAME_CHUNK, kMaxChunk + 1)), "chunk_length", "max_chunk_bytes"},
      {Encode(Header(v1::FRAME_CHUNK, 0)), "chunk_length", "is not in 1.."},
      {Encode(Header(v1::FRAME_CANCEL, 3)), "bad_header", "CANCEL carries no payload"},
  };
  for (const BadHeader& c : cases) {
    absl::StatusOr<FrameHeader> got = DecodeClientFrameHeader(c.bytes.data(), kMaxChunk);
    ASSERT_FALSE(got.ok()) << c.reason;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status()));
    EXPECT_EQ(ViolationReason(got.status()), c.reason);
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.message));
  }
}

TEST(FrameTest, OtherStatusesHaveNoReason) {
  EXPECT_EQ(ViolationReason(absl::UnauthenticatedError("no")), "other");
}

}  // namespace
}  // namespace attnserve::transport::data
