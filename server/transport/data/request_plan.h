// A DataRequest checked as the gRPC service checks its message, before any payload arrives:
// the call decoded (proto_codec), the payload's size computed from the tensors' dtypes and
// shapes (overflow-checked, within max_message_bytes), chunking, deadline and priority, and
// the engine's own validation (which reads shapes and sizes only, never tensor bytes). What
// remains is to point the tensor views at the received bytes.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/data_channel.pb.h"
#include "server/engine/attention_request.h"
#include "server/engine/limits.h"
#include "server/engine/priority.h"

namespace attnserve::transport::data {

struct PlannedCall {
  std::variant<engine::ForwardInputs, engine::BackwardInputs> inputs;
  // Where each tensor that travels lies in the payload, in field order.
  struct Slice {
    int tensor;  // index into TensorViews(inputs)
    int64_t offset;
    int64_t bytes;
  };
  std::vector<Slice> slices;
  int64_t payload_bytes = 0;
  int64_t chunk_bytes = 0;
  absl::Duration timeout = absl::InfiniteDuration();  // from DataRequest.timeout_ms
  engine::Priority priority = engine::Priority::kNormal;

  bool backward() const { return inputs.index() == 1; }
  // Points the travelling tensors' views at their bytes in a payload starting at `base`.
  void PointInto(const char* base);
};

// "Forward" or "Backward" (the gRPC method names, for metrics); null when neither is set.
const char* RpcName(const v1::DataRequest& request);

// The call, or the status to answer it with (INVALID_ARGUMENT, RESOURCE_EXHAUSTED for limits,
// naming the field).
absl::StatusOr<PlannedCall> PlanCall(const v1::DataRequest& request, const engine::Limits& limits,
                                     int64_t max_chunk_bytes);

}  // namespace attnserve::transport::data
