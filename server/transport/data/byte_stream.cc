#include "server/transport/data/byte_stream.h"

#include <algorithm>

#include "server/transport/data/socket_io.h"

namespace attnserve::transport::data {

absl::Status Discard(ByteStream& stream, size_t size, absl::Duration stall_timeout) {
  char scratch[64 << 10];
  while (size > 0) {
    const size_t step = std::min(size, sizeof(scratch));
    if (absl::Status s = stream.ReadExact(scratch, step, stall_timeout, stall_timeout); !s.ok()) {
      return s;
    }
    size -= step;
  }
  return absl::OkStatus();
}

absl::Status PlainStream::ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                                    absl::Duration stall_timeout) {
  return data::ReadExact(fd_, out, size, first_byte_timeout, stall_timeout);
}

absl::Status PlainStream::SendAll(const char* header, size_t header_size, const char* payload,
                                  size_t payload_size) {
  return data::SendAll(fd_, header, header_size, payload, payload_size);
}

}  // namespace attnserve::transport::data
