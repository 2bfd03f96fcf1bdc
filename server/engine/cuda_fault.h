// Which CUDA errors are sticky: after one the device's context is unusable for every later call
// (until cudaDeviceReset), as opposed to an error of one call (bad argument, out of memory)
// that the next request does not see. CudaStatus turns a sticky one into a device fault
// (device_fault.h), which takes the device out of service.
#pragma once

#include <cuda_runtime_api.h>

namespace attnserve::engine {

bool IsStickyCudaError(cudaError_t err);

}  // namespace attnserve::engine
