// Builds and reads the wire's Tensor messages from float values: the conversions every caller
// of the C++ client needs (fp16/bf16 rounding is round-to-nearest-even).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve {

// A tensor of `dtype` holding `values` (row-major, product(shape) of them).
absl::StatusOr<v1::Tensor> MakeTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                      const std::vector<float>& values);

// The tensor's elements as floats; fails if its byte count does not match its shape.
absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor);

// Bytes per element of a dtype, 0 for DTYPE_UNSPECIFIED.
int DTypeItemSize(v1::DType dtype);

}  // namespace attnserve
