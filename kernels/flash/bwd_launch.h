// Host-side entry to one compiled flash backward (element type x instantiated head dim): the
// preprocess, dK/dV and dQ kernels. Each instantiation lives in its own generated file under
// instantiations/.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention_params.h"
#include "kernels/flash/arch.h"
#include "kernels/flash/bwd_args.h"
#include "kernels/flash/extras_args.h"

namespace attnserve::kernels::flash {

// Launches Arch's backward kernels for kHeadDim >= args.fwd.head_dim on `stream`, checking
// each launch: the wide dK/dV kernel where grid.smem_limit holds it, else the narrow one. The
// caller has validated args, checked that grid.smem_limit holds the narrow variant and
// provided args.dsum.
template <class Arch, DType kDType, int kHeadDim>
KernelStatus LaunchBackward(const BwdKernelArgs& args, const BwdGrid& grid, cudaStream_t stream);

// The sm80 backward with dropout and ALiBi (extras_args.h), both dQ modes; the same contract.
// The only extras instantiation of the backward: Hopper runs it too, Turing refuses these options.
template <DType kDType, int kHeadDim>
KernelStatus LaunchBackwardExtras(const BwdKernelArgsX& args, const BwdGrid& grid,
                                  cudaStream_t stream);

// The Hopper (sm_90a) backward for kHeadDim (bwd_sm90_launch.cuh; atomic-dQ mode only, so
// args.dq_accum must be set): preprocess, wgmma dK/dV kernel, dQ conversion. The caller has
// checked that grid.smem_limit holds Sm90BackwardMaxSmemBytes(kHeadDim).
template <DType kDType, int kHeadDim>
KernelStatus LaunchBackwardSm90(const BwdKernelArgs& args, const BwdGrid& grid,
                                cudaStream_t stream);

}  // namespace attnserve::kernels::flash
