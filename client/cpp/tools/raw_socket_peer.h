// The raw socket that attnload's payload rate is compared with: `bytes` moved one way between
// two threads of this process over loopback TCP, on 1 and on N connections, sendmsg from one
// buffer and recv into another, with the data channel's socket buffer sizes. Nothing else
// happens to the bytes, so this is the ceiling of any transport on this machine.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace attnserve::load {

// GB/s (1e9 bytes per second) of `bytes` split evenly over `connections` connections.
absl::StatusOr<double> MeasureRawSocket(int64_t bytes, int connections);

struct RawSocketResult {
  int64_t bytes = 0;
  int connections = 0;  // of the N-connection measurement
  double gbps_one = 0, gbps_many = 0;
};

}  // namespace attnserve::load
