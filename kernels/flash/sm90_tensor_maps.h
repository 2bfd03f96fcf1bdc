// Tensor maps (TMA descriptors) of the Hopper forward's loads and stores, made on the host for
// each launch (loads at head dim 256, Sm90ForwardTma; stores of O, Sm90ForwardTmaStore): q, k, v
// and out as [rows, heads, head_dim] tensors of 16-bit elements, each box one head's 64 columns
// of `box_rows` rows, 128-byte swizzled: exactly one head-dim block of sm90_swizzled_tile.cuh's
// layout. Columns past head_dim and rows past the tensor read as zeros and are not written;
// rows past one sequence are the next one's (the kernel loads the tile holding a sequence's last
// key with cp.async instead, and stores rows that cross a sequence's end without TMA). The
// driver's encoder is found through the runtime (cudaGetDriverEntryPointByVersion), so nothing
// links libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/attention_params.h"

namespace attnserve::kernels::flash {

struct FwdSm90TmaMaps {
  CUtensorMap q;
  CUtensorMap k;
  CUtensorMap v;
};
struct FwdSm90NoMaps {};
// What the Hopper forward kernels get beside their arguments: the load maps when they load with
// TMA, and out's map (boxes of one warp's 16 rows) when they store O with TMA.
template <bool kTmaLoads, bool kTmaStore>
struct FwdSm90Maps {
  std::conditional_t<kTmaLoads, FwdSm90TmaMaps, FwdSm90NoMaps> loads;
  std::conditional_t<kTmaStore, CUtensorMap, FwdSm90NoMaps> out;
};

// The driver's cuTensorMapEncodeTiled, or null when the driver does not offer it.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

// The map of a [rows, heads, head_dim] tensor at `base` (row_stride elements between rows) with
// boxes of 64 columns x 1 head x box_rows rows; `what` names the tensor in errors. TMA takes
// int32 coordinates, so rows must stay below 2^31.
inline KernelStatus EncodeHeadBlockMap(CUtensorMap* map, const void* base, int64_t rows,
                                       int heads, int head_dim, int64_t row_stride,
                                       int box_rows, const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) {
    return KernelStatus::Error("flash: the driver offers no cuTensorMapEncodeTiled (TMA)");
  }
  if (rows > INT_MAX) {
    return KernelStatus::Error(std::string("flash: sm90 forward with TMA: ") + what + " has " +
                               std::to_string(rows) + " rows, more than TMA's int32 coordinates");
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * 2,
                                 static_cast<cuuint64_t>(row_stride) * 2};  // bytes
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return KernelStatus::Error(std::string("flash: cuTensorMapEncodeTiled failed for ") + what +
                               " (error " + std::to_string(static_cast<int>(result)) +
                               "; base and row stride must be 16-byte aligned)");
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::flash
