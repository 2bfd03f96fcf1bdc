// libFuzzer target: bytes a data channel client sends -> frame header -> (REQUEST) the
// DataRequest -> PlanCall -> payload layout and chunk tracking. Input: a 32-byte frame
// header, then its payload. Whatever the bytes, decoding and planning must answer with a
// status, never crash, and an accepted plan must lay every tensor inside its payload.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "attnserve/v1/data_channel.pb.h"
#include "server/transport/data/chunk_tracker.h"
#include "server/transport/data/frame.h"
#include "server/transport/data/request_plan.h"

namespace {

using attnserve::transport::data::ChunkTracker;
using attnserve::transport::data::FrameHeader;
using attnserve::transport::data::PlannedCall;

constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 20;

// Small limits keep accepted payloads small, so an input never allocates much.
attnserve::engine::Limits FuzzLimits() {
  attnserve::engine::Limits limits;
  limits.max_message_bytes = 1 << 20;
  limits.max_total_tokens = 256;
  limits.max_head_dim = 64;
  limits.max_num_heads = 8;
  limits.max_batch = 16;
  return limits;
}

void CheckPlan(PlannedCall& plan) {
  std::vector<char> payload(static_cast<size_t>(plan.payload_bytes));
  int64_t end = 0;
  for (const PlannedCall::Slice& slice : plan.slices) {
    if (slice.offset != end || slice.bytes < 0) std::abort();
    end += slice.bytes;
  }
  if (end != plan.payload_bytes) std::abort();
  plan.PointInto(payload.data());
  ChunkTracker tracker(plan.payload_bytes, plan.chunk_bytes);
  for (int64_t offset = 0; offset < plan.payload_bytes; offset += plan.chunk_bytes) {
    const int64_t length = std::min(plan.chunk_bytes, plan.payload_bytes - offset);
    if (!tracker.Claim(offset, length).ok()) std::abort();
    if (tracker.Claim(offset, length).ok()) std::abort();  // a repeat is always refused
    tracker.Arrived(length);
  }
  if (!tracker.complete()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < attnserve::transport::data::kFrameHeaderBytes) return 0;
  const char* bytes = reinterpret_cast<const char*>(data);
  absl::StatusOr<FrameHeader> header =
      attnserve::transport::data::DecodeClientFrameHeader(bytes, kMaxChunkBytes);
  if (!header.ok() || header->type != attnserve::v1::FRAME_REQUEST) return 0;
  attnserve::v1::DataRequest request;
  const size_t rest = size - attnserve::transport::data::kFrameHeaderBytes;
  if (!request.ParseFromArray(bytes + attnserve::transport::data::kFrameHeaderBytes,
                              static_cast<int>(rest))) {
    return 0;
  }
  absl::StatusOr<PlannedCall> plan =
      attnserve::transport::data::PlanCall(request, FuzzLimits(), kMaxChunkBytes);
  if (plan.ok()) CheckPlan(*plan);
  return 0;
}
