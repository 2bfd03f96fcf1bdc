// Blocking socket I/O with timeouts, for the data channel's thread-per-connection design
// (data_server.h says why). Reads wait with poll(); sends rely on SO_SNDTIMEO, which makes a
// send that cannot progress return, so a peer that stops reading is noticed.
#pragma once

#include <sys/uio.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace attnserve::transport::data {

// TCP_NODELAY, socket buffers of `buffer_bytes`, keepalive (dead peers of idle connections
// are noticed), and `send_timeout` for sends that make no progress.
void ConfigureConnectedSocket(int fd, int buffer_bytes, absl::Duration send_timeout);

// Reads exactly `size` bytes into `out`, polling only when the socket has nothing yet. The first byte may take `first_byte_timeout`
// (InfiniteDuration: wait for ever), each later one `stall_timeout`. UNAVAILABLE when the
// peer closed or the socket failed, DEADLINE_EXCEEDED on a timeout.
absl::Status ReadExact(int fd, char* out, size_t size, absl::Duration first_byte_timeout,
                       absl::Duration stall_timeout);

// Sends `parts` laid end to end with one sendmsg per step (no copy).
absl::Status SendAll(int fd, absl::Span<const iovec> parts);

}  // namespace attnserve::transport::data
