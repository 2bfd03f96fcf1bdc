#include "kernels/fault/trap_kernel.h"

namespace attnserve::kernels::fault {
namespace {

__global__ void TrapKernel() { __trap(); }

}  // namespace

cudaError_t LaunchTrapKernel(cudaStream_t stream) {
  TrapKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace attnserve::kernels::fault
