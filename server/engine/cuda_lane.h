// One lane of a CUDA device worker: a stream, kernel-timing events, a pinned staging buffer and
// the threads that gather into it. Run() takes a request (or a batch of them) through the lane:
// each input gathered from its pieces straight into pinned memory by several threads, its copy
// to the device issued at once so it overlaps the staging of the next, the kernel launch, every output back in one copy, left in pinned memory
// for the caller to split. Device memory comes from the device's stream-ordered pool and goes
// back to it whatever happens.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/parallel_copy.h"

namespace attnserve::engine {

// A CUDA error as a status naming the call; out-of-memory is RESOURCE_EXHAUSTED, so only the
// request that hit it fails and its client can tell why.
absl::Status CudaStatus(cudaError_t err, const char* what);

// One device input: the concatenation of its pieces (one tensor, or a batch's parts' tensors).
using GatheredInput = std::vector<HostBytes>;

// What a Run leaves: its outputs in the lane's pinned memory (valid until the lane's next Run)
// and where the time went.
struct LaneRun {
  std::vector<const char*> outputs;
  float kernel_ms = 0;           // between the timing events around `launch`
  double stage_in_seconds = 0;   // gathering inputs into pinned memory (copies overlap it)
  double device_seconds = 0;     // then waiting for the transfers and kernels
};

// Device addresses of one run's segments, in the order they were given.
struct DeviceBuffers {
  std::vector<char*> inputs;
  std::vector<char*> outputs;
  char* workspace = nullptr;
};

class CudaLane {
 public:
  // stage_threads: threads that gather inputs into pinned memory (the lane's own and helpers).
  static absl::StatusOr<std::unique_ptr<CudaLane>> Create(int ordinal, int stage_threads);
  ~CudaLane();

  int ordinal() const { return ordinal_; }

  // Copies `inputs` to the device, calls `launch` (which enqueues kernels on `stream` between
  // the timing events), copies back `output_sizes` bytes per output, and waits.
  absl::StatusOr<LaneRun> Run(
      const std::vector<GatheredInput>& inputs, const std::vector<size_t>& output_sizes,
      size_t workspace_bytes,
      const std::function<absl::Status(const DeviceBuffers&, cudaStream_t)>& launch);

 private:
  CudaLane() = default;
  absl::Status ReservePinned(size_t bytes);

  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t kernel_start_ = nullptr, kernel_end_ = nullptr;
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::unique_ptr<ParallelCopier> gather_;
};

}  // namespace attnserve::engine
