// Per-call limits the transports enforce (and ServerInfo reports), beside the engine's size
// limits.
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace attnserve::transport {

struct CallLimits {
  // Forward/Backward calls in progress at once, over all connections; past it a call is
  // refused at once with RESOURCE_EXHAUSTED instead of holding its message in memory while
  // it waits. 0 = unlimited.
  int64_t max_concurrent_requests = 0;
  // Longest a call may stay queued: longer client deadlines are shortened to it, and calls
  // without one get it. Infinite = the client's deadline, if any.
  absl::Duration max_deadline = absl::InfiniteDuration();
  // How long a gRPC answer may take to be written out once computed; a client that does not
  // read it by then has its call cancelled (its memory and slot freed). Infinite: no limit.
  absl::Duration answer_send_timeout = absl::InfiniteDuration();
  // Where the bulk data path (transport/data) listens and what it allows, reported as
  // ServerInfo.data_channel so clients can use it. port 0: the path is off.
  struct DataChannel {
    int port = 0;
    int64_t max_chunk_bytes = 0;
    int32_t max_connections_per_session = 0;
    bool tls = false;  // connections start with a TLS handshake
  };
  DataChannel data_channel;
};

}  // namespace attnserve::transport
