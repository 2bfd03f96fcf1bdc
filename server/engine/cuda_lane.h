// One lane of a CUDA device worker: a stream, kernel-timing events and a pinned staging buffer.
// Run() takes a request through the lane: every input into pinned memory and onto the device in
// one copy, the kernel launch, every output back in one copy. Device memory comes from the
// device's stream-ordered pool and goes back to it whatever happens.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnserve::engine {

// A CUDA error as a status naming the call; out-of-memory is RESOURCE_EXHAUSTED, so only the
// request that hit it fails and its client can tell why.
absl::Status CudaStatus(cudaError_t err, const char* what);

struct HostBytes {
  const void* data;
  size_t size;
};

// Device addresses of one run's segments, in the order they were given.
struct DeviceBuffers {
  std::vector<char*> inputs;
  std::vector<char*> outputs;
  char* workspace = nullptr;
};

class CudaLane {
 public:
  static absl::StatusOr<std::unique_ptr<CudaLane>> Create(int ordinal);
  ~CudaLane();

  int ordinal() const { return ordinal_; }

  // Copies `inputs` to the device, calls `launch` (which enqueues kernels on `stream` between
  // the timing events), copies back `output_sizes` bytes per output into `outputs`, and waits.
  // `kernel_ms` receives the time between the events.
  absl::Status Run(const std::vector<HostBytes>& inputs, const std::vector<size_t>& output_sizes,
                   size_t workspace_bytes,
                   const std::function<absl::Status(const DeviceBuffers&, cudaStream_t)>& launch,
                   std::vector<std::string>* outputs, float* kernel_ms);

 private:
  CudaLane() = default;
  absl::Status ReservePinned(size_t bytes);

  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t kernel_start_ = nullptr, kernel_end_ = nullptr;
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
};

}  // namespace attnserve::engine
