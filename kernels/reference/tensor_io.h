// Moves rows of packed fp16/bf16/fp32 tensors to and from float scratch. Tensor bytes come
// straight out of network buffers and may sit at any address, so every access goes through
// memcpy rather than a typed pointer.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace attnserve::kernels::reference {

// dst[0, n) = float(tensor[offset, offset + n)), offsets counted in elements of `dtype`.
void LoadRow(DType dtype, const void* tensor, int64_t offset, int n, float* dst);

// tensor[offset, offset + n) = src[0, n) converted to `dtype` (round to nearest even).
void StoreRow(DType dtype, const float* src, int n, void* tensor, int64_t offset);

// Single float32 elements of lse, which may be unaligned like every other tensor.
float LoadFloat(const float* tensor, int64_t offset);
void StoreFloat(float value, float* tensor, int64_t offset);

}  // namespace attnserve::kernels::reference
