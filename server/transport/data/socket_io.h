// Blocking socket I/O with timeouts, for the data channel's thread-per-connection design
// (data_server.h says why). Reads wait with poll(); sends rely on SO_SNDTIMEO, which makes a
// send that cannot progress return, so a peer that stops reading is noticed.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace attnserve::transport::data {

// TCP_NODELAY, socket buffers of `buffer_bytes`, keepalive (dead peers of idle connections
// are noticed), and `send_timeout` for sends that make no progress.
void ConfigureConnectedSocket(int fd, int buffer_bytes, absl::Duration send_timeout);

// Reads exactly `size` bytes into `out`. The first byte may take `first_byte_timeout`
// (InfiniteDuration: wait for ever), each later one `stall_timeout`. UNAVAILABLE when the
// peer closed or the socket failed, DEADLINE_EXCEEDED on a timeout.
absl::Status ReadExact(int fd, char* out, size_t size, absl::Duration first_byte_timeout,
                       absl::Duration stall_timeout);

// Sends `header` then `payload` with one sendmsg per step (no copy of the payload).
absl::Status SendAll(int fd, const char* header, size_t header_size, const char* payload,
                     size_t payload_size);

}  // namespace attnserve::transport::data
