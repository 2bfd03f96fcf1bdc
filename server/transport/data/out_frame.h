// Frames on their way to a client, queued per connection. A message frame owns its
// serialized protobuf; a CHUNK frame points into its response's tensor bytes (kept alive by
// the frame), so tensor bytes are never copied into frames.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "server/transport/data/data_context.h"
#include "server/transport/data/frame.h"

namespace attnserve::transport::data {

// One response tensor's bytes: the result's own, or where the engine wrote them (the call's
// buffers, kept alive by OutboundResponse::memory).
struct ResponseTensor {
  std::string owned;
  const char* at = nullptr;  // set: the bytes are here, not in `owned`
  size_t bytes = 0;

  const char* data() const { return at != nullptr ? at : owned.data(); }
  size_t size() const { return at != nullptr ? bytes : owned.size(); }
};

// A call's answer being sent: its tensor bytes, and its slot until the last frame is sent or
// every frame is dropped (its connections closed).
struct OutboundResponse {
  ~OutboundResponse();

  std::unique_ptr<SlotLease> lease;
  std::vector<ResponseTensor> tensors;
  std::shared_ptr<const void> memory;  // what tensors' `at` point into
  absl::Time queued;
  metrics::DataMetrics* metrics = nullptr;
  std::atomic<int64_t> unsent_frames{0};
};

struct OutFrame {
  char header[kFrameHeaderBytes];
  std::string message;
  std::shared_ptr<OutboundResponse> response;  // set on a response's frames
  const char* data = nullptr;                  // CHUNK payload, inside response->tensors
  size_t size = 0;
  bool last = false;  // the connection closes once this is sent (an ERROR frame)

  const char* payload() const { return data != nullptr ? data : message.data(); }
  size_t payload_size() const { return data != nullptr ? size : message.size(); }
};

// A frame carrying `message` serialized.
OutFrame MessageFrame(v1::FrameType type, uint64_t request_id,
                      const google::protobuf::MessageLite& message);
// An ERROR frame for a violation (or any status), after which the connection closes.
OutFrame ErrorFrame(const absl::Status& status);
// A RESPONSE that only carries `status` (a refusal, a failure).
OutFrame StatusResponseFrame(uint64_t request_id, const absl::Status& status);
// Response bytes [offset, offset + size) of `response`, which lie at `data`, as CHUNK frames
// at most `chunk_bytes` long, appended to `frames` (counted in response->unsent_frames).
void AppendChunkFrames(uint64_t request_id, const std::shared_ptr<OutboundResponse>& response,
                       const char* data, uint64_t offset, size_t size, int64_t chunk_bytes,
                       std::vector<OutFrame>* frames);
// The RESPONSE frame `message` and the CHUNK frames of `response`'s tensors (laid end to end,
// cut at most `chunk_bytes` long, never across two tensors), less the byte ranges `sent`
// already (sorted, disjoint [begin, end) offsets: a grouped forward's early out rows).
std::vector<OutFrame> ResponseFrames(uint64_t request_id, const google::protobuf::MessageLite& message,
                                     std::shared_ptr<OutboundResponse> response,
                                     int64_t chunk_bytes,
                                     const std::vector<std::pair<uint64_t, uint64_t>>& sent = {});

}  // namespace attnserve::transport::data
