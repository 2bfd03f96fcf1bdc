// The sum a backward split into blocks of one sequence's query rows needs on a GPU
// (server/engine/launch_split.h): each block's launch writes partial dk and dv, in the
// tensors' dtype, for the sequence's keys [0, key_end); they are added into float32
// accumulators sized to that sequence's keys, and after its last block the accumulators are
// written as the final dk and dv in the tensors' dtype. Elementwise, one thread per element,
// so the sum's order is the blocks' launch order: a deterministic backward stays so.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/attention_params.h"

namespace attnserve::kernels::gradient_sum {

// accumulator[i] += float(partial[i]) for i in [0, elements); `partial` holds `dtype`.
cudaError_t Accumulate(DType dtype, const void* partial, int64_t elements, float* accumulator,
                       cudaStream_t stream);

// out[i] = accumulator[i] converted to `dtype` (round to nearest even), i in [0, elements).
cudaError_t Store(DType dtype, const float* accumulator, int64_t elements, void* out,
                  cudaStream_t stream);

}  // namespace attnserve::kernels::gradient_sum
