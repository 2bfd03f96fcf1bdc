// Saved contexts in device memory. A kept forward's launch buffer becomes its context as it
// is: its inputs (q, k, v, cu_seqlens_q, cu_seqlens_k) and outputs (out, lse) are exactly what
// the backward reads, so keeping the buffer costs no copy and no second allocation (a
// device-to-device copy would need both for a moment); it wastes only the forward's workspace
// and alignment padding, which are counted in its bytes.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/cuda_lane.h"
#include "server/engine/saved_context.h"

namespace attnserve::engine {

// The context in a kept forward buffer laid out as CudaWorker's forward stages it: inputs q,
// k, v, cu_seqlens_q, cu_seqlens_k; outputs out, lse.
std::unique_ptr<ContextMemory> ContextInForwardBuffer(std::unique_ptr<KeptDeviceMemory> kept);

// Host copies of a device context's tensors, for a backward that runs on the host.
absl::StatusOr<std::unique_ptr<ContextMemory>> CopyToHost(const SavedContext& context);

}  // namespace attnserve::engine
