#include "kernels/reference/tensor_io.h"

#include <cstring>

#include "kernels/reference/half_convert.h"

namespace attnserve::kernels::reference {
namespace {

uint16_t Load16(const unsigned char* bytes, int64_t index) {
  uint16_t value;
  std::memcpy(&value, bytes + 2 * index, sizeof(value));
  return value;
}

void Store16(uint16_t value, unsigned char* bytes, int64_t index) {
  std::memcpy(bytes + 2 * index, &value, sizeof(value));
}

}  // namespace

void LoadRow(DType dtype, const void* tensor, int64_t offset, int n, float* dst) {
  const auto* bytes = static_cast<const unsigned char*>(tensor);
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, bytes + 4 * offset, sizeof(float) * n);
      return;
    case DType::kFloat16:
      for (int i = 0; i < n; ++i) dst[i] = HalfToFloat(Load16(bytes, offset + i));
      return;
    case DType::kBFloat16:
      for (int i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(Load16(bytes, offset + i));
      return;
  }
}

void StoreRow(DType dtype, const float* src, int n, void* tensor, int64_t offset) {
  auto* bytes = static_cast<unsigned char*>(tensor);
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(bytes + 4 * offset, src, sizeof(float) * n);
      return;
    case DType::kFloat16:
      for (int i = 0; i < n; ++i) Store16(FloatToHalf(src[i]), bytes, offset + i);
      return;
    case DType::kBFloat16:
      for (int i = 0; i < n; ++i) Store16(FloatToBFloat16(src[i]), bytes, offset + i);
      return;
  }
}

float LoadFloat(const float* tensor, int64_t offset) {
  float value;
  std::memcpy(&value, reinterpret_cast<const unsigned char*>(tensor) + 4 * offset, sizeof(value));
  return value;
}

void StoreFloat(float value, float* tensor, int64_t offset) {
  std::memcpy(reinterpret_cast<unsigned char*>(tensor) + 4 * offset, &value, sizeof(value));
}

}  // namespace attnserve::kernels::reference
