// A kernel that traps, for test-only fault injection (--inject_device_fault on a GPU): it
// leaves its device with a real sticky error, as an illegal address or an ECC error would, so
// the server's fault handling is tested against the driver rather than a simulation.
#pragma once

#include <cuda_runtime_api.h>

namespace attnserve::kernels::fault {

// Enqueues one trapping thread on `stream`; the launch itself normally succeeds and the error
// surfaces when the stream is synchronized (cudaErrorLaunchFailure or similar, sticky).
cudaError_t LaunchTrapKernel(cudaStream_t stream);

}  // namespace attnserve::kernels::fault
