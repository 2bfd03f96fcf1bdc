// Host-side entry to one compiled flash forward kernel (code path x element type x instantiated
// head dim).
// Each instantiation lives in its own generated file under instantiations/.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention_params.h"
#include "kernels/flash/arch.h"
#include "kernels/flash/extras_args.h"
#include "kernels/flash/fwd_args.h"

namespace attnserve::kernels::flash {

struct FwdGrid {
  int batch;
  int max_seqlen_q;
  int max_seqlen_k;
  int multiprocessors;  // the device's SMs: the persistent Hopper forward's CTA count at most
  int64_t total_k;      // key rows of k and v (the Hopper forward's tensor maps)
};

// Launches Arch's kernel for kHeadDim >= args.head_dim on `stream` and checks the launch. The
// caller has validated args and checked the device (compute capability, shared memory).
template <class Arch, DType kDType, int kHeadDim>
KernelStatus LaunchForward(const FwdKernelArgs& args, const FwdGrid& grid, cudaStream_t stream);

// The sm80 forward with dropout and ALiBi (extras_args.h); the same contract. The only extras
// instantiation of the forward: Hopper runs it too, Turing refuses these options.
template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardExtras(const FwdKernelArgsX& args, const FwdGrid& grid,
                                 cudaStream_t stream);

// The Hopper (sm_90a, wgmma) forward for kHeadDim >= args.head_dim (kSm90ForwardHeadDims); the
// same contract. Built only when the build targets sm_90 (ATTN_FLASH_SM90).
template <DType kDType, int kHeadDim>
KernelStatus LaunchForwardSm90(const FwdKernelArgs& args, const FwdGrid& grid,
                               cudaStream_t stream);

}  // namespace attnserve::kernels::flash
