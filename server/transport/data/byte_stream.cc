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

absl::Status PlainStream::SendAll(absl::Span<const iovec> parts) {
  return data::SendAll(fd_, parts);
}

}  // namespace attnserve::transport::data
