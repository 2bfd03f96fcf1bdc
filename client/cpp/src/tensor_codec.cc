#include "attnserve/tensor_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/reference/half_convert.h"

namespace attnserve {
namespace {

using kernels::reference::BFloat16ToFloat;
using kernels::reference::FloatToBFloat16;
using kernels::reference::FloatToHalf;
using kernels::reference::HalfToFloat;

int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

}  // namespace

int DTypeItemSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_FLOAT32:
      return 4;
    default:
      return 0;
  }
}

absl::StatusOr<v1::Tensor> MakeTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                                      const std::vector<float>& values) {
  const int item = DTypeItemSize(dtype);
  if (item == 0) return absl::InvalidArgumentError("MakeTensor: dtype must be specified");
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError("MakeTensor: negative dimension");
  }
  if (ElementCount(shape) != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("MakeTensor: shape holds ", ElementCount(shape),
                                                   " elements, got ", values.size(), " values"));
  }
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  std::string* data = tensor.mutable_data();
  data->resize(values.size() * item);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == v1::DTYPE_FLOAT32) {
      std::memcpy(data->data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits =
          dtype == v1::DTYPE_FLOAT16 ? FloatToHalf(values[i]) : FloatToBFloat16(values[i]);
      std::memcpy(data->data() + 2 * i, &bits, 2);
    }
  }
  return tensor;
}

absl::StatusOr<std::vector<float>> TensorToFloats(const v1::Tensor& tensor) {
  const int item = DTypeItemSize(tensor.dtype());
  if (item == 0) return absl::InvalidArgumentError("tensor dtype is unspecified");
  const std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  const int64_t count = ElementCount(shape);
  if (static_cast<int64_t>(tensor.data().size()) != count * item) {
    return absl::InvalidArgumentError(absl::StrCat("tensor has ", tensor.data().size(),
                                                   " bytes, its shape needs ", count * item));
  }
  std::vector<float> values(count);
  const char* bytes = tensor.data().data();
  for (int64_t i = 0; i < count; ++i) {
    if (item == 4) {
      std::memcpy(&values[i], bytes + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      values[i] = tensor.dtype() == v1::DTYPE_FLOAT16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
    }
  }
  return values;
}

}  // namespace attnserve
