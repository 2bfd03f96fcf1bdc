#include "server/transport/data/chunk_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/transport/data/frame.h"

namespace attnserve::transport::data {

ChunkTracker::ChunkTracker(int64_t total_bytes, int64_t chunk_bytes)
    : total_(total_bytes),
      chunk_bytes_(chunk_bytes),
      claimed_(static_cast<size_t>((total_bytes + chunk_bytes - 1) / chunk_bytes), false) {}

absl::Status ChunkTracker::Claim(uint64_t offset, uint64_t length) {
  const uint64_t total = static_cast<uint64_t>(total_);
  const uint64_t chunk = static_cast<uint64_t>(chunk_bytes_);
  if (offset >= total) {
    return Violation(absl::StatusCode::kInvalidArgument, "chunk_out_of_range",
                     absl::StrCat("CHUNK offset ", offset, " is beyond the payload of ", total,
                                  " bytes"));
  }
  if (offset % chunk != 0) {
    return Violation(absl::StatusCode::kInvalidArgument, "chunk_out_of_range",
                     absl::StrCat("CHUNK offset ", offset,
                                  " is not a multiple of the request's chunk_bytes ", chunk));
  }
  const uint64_t expected = std::min(chunk, total - offset);
  if (length != expected) {
    return Violation(absl::StatusCode::kInvalidArgument, "chunk_length",
                     absl::StrCat("CHUNK at offset ", offset, " must carry ", expected,
                                  " bytes, got ", length));
  }
  const size_t index = static_cast<size_t>(offset / chunk);
  if (claimed_[index]) {
    return Violation(absl::StatusCode::kInvalidArgument, "duplicate_chunk",
                     absl::StrCat("CHUNK at offset ", offset, " was already sent"));
  }
  claimed_[index] = true;
  return absl::OkStatus();
}

bool ChunkTracker::Arrived(uint64_t length) {
  received_ += static_cast<int64_t>(length);
  return complete();
}

}  // namespace attnserve::transport::data
