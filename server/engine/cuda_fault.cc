#include "server/engine/cuda_fault.h"

namespace attnserve::engine {

bool IsStickyCudaError(cudaError_t err) {
  switch (err) {
    // A kernel that faulted: its context is corrupt (CUDA Runtime API, "cudaError").
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:  // what __trap() leaves
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    // The hardware itself, or a context already lost.
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
      return true;
    default:
      return false;
  }
}

}  // namespace attnserve::engine
