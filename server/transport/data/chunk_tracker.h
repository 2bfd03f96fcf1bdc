// Which chunks of a request's payload have arrived. The spec allows exactly one division:
// chunk i covers [i * chunk_bytes, min((i + 1) * chunk_bytes, total)), each sent once; a
// bitmap of claimed chunks catches repeats. Not thread-safe: the session's lock guards it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace attnserve::transport::data {

class ChunkTracker {
 public:
  // `chunk_bytes` > 0.
  ChunkTracker(int64_t total_bytes, int64_t chunk_bytes);

  // Marks the chunk at `offset` as arriving; a protocol violation (frame.h) when no chunk
  // starts there, its length is not that chunk's, or it was claimed before.
  absl::Status Claim(uint64_t offset, uint64_t length);
  // A claimed chunk's bytes are all in; true when that completes the payload.
  bool Arrived(uint64_t length);

  int64_t total_bytes() const { return total_; }
  bool complete() const { return received_ == total_; }

 private:
  const int64_t total_;
  const int64_t chunk_bytes_;
  int64_t received_ = 0;
  std::vector<bool> claimed_;
};

}  // namespace attnserve::transport::data
