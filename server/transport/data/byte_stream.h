// What a data channel connection reads and writes through: the plain socket, or TLS over it.
// Connections call these from two threads at once (one reader, one writer); each stream must
// allow that.
#pragma once

#include <sys/uio.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace attnserve::transport::data {

class ByteStream {
 public:
  virtual ~ByteStream() = default;

  // Before the first frame: whatever the stream must agree with its peer (a TLS handshake),
  // within `timeout`. An error names what failed.
  virtual absl::Status Open(absl::Duration timeout) = 0;
  // As socket_io.h's ReadExact and SendAll.
  virtual absl::Status ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                                 absl::Duration stall_timeout) = 0;
  // `parts` laid end to end: one or more frames, each its header then its payload.
  virtual absl::Status SendAll(absl::Span<const iovec> parts) = 0;
};

// Reads and drops `size` bytes, as ReadExact.
absl::Status Discard(ByteStream& stream, size_t size, absl::Duration stall_timeout);

// The socket itself: socket_io.h's functions, zero-copy both ways.
class PlainStream final : public ByteStream {
 public:
  explicit PlainStream(int fd) : fd_(fd) {}
  absl::Status Open(absl::Duration) override { return absl::OkStatus(); }
  absl::Status ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                         absl::Duration stall_timeout) override;
  absl::Status SendAll(absl::Span<const iovec> parts) override;

 private:
  const int fd_;
};

}  // namespace attnserve::transport::data
