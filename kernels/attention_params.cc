#include "kernels/attention_params.h"

namespace attnserve::kernels {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
  }
  return "unknown";
}

}  // namespace attnserve::kernels
