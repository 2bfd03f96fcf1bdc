// The ALiBi slopes of a launch in device memory, for every GPU family: the caller's device copy
// (AttentionOptions::alibi_slopes_device, e.g. from the C ABI) when it gave one, else a copy of
// the host slopes (the engine's) made here on `stream` and freed in stream order when this
// object goes. Empty when ALiBi is off.
// Header-only so each family links nothing more than the CUDA runtime it already uses.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention_params.h"

namespace attnserve::kernels {

class DeviceAlibiSlopes {
 public:
  DeviceAlibiSlopes() = default;
  ~DeviceAlibiSlopes() {
    if (owned_ != nullptr) cudaFreeAsync(owned_, stream_);
  }
  DeviceAlibiSlopes(const DeviceAlibiSlopes&) = delete;
  DeviceAlibiSlopes& operator=(const DeviceAlibiSlopes&) = delete;

  // "" on success, else what failed (the caller prefixes its family's name).
  std::string Init(const AttentionOptions& options, const AttentionShape& shape,
                   cudaStream_t stream) {
    if (!options.has_alibi()) return "";
    stride_ = options.alibi_slopes_stride;
    const int64_t first = stride_ == 0 ? 0 : int64_t{options.first_sequence} * stride_;
    if (options.alibi_slopes_device != nullptr) {
      base_ = options.alibi_slopes_device + first;
      return "";
    }
    const size_t count = stride_ == 0 ? static_cast<size_t>(shape.num_heads)
                                      : static_cast<size_t>(shape.batch) * stride_;
    stream_ = stream;
    void* device = nullptr;
    cudaError_t err = cudaMallocAsync(&device, count * sizeof(float), stream);
    if (err != cudaSuccess) return Failed("cudaMallocAsync (ALiBi slopes)", err);
    owned_ = static_cast<float*>(device);
    err = cudaMemcpyAsync(owned_, options.alibi_slopes + first, count * sizeof(float),
                          cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return Failed("cudaMemcpyAsync (ALiBi slopes)", err);
    base_ = owned_;
    return "";
  }

  // Sequence 0 of this launch (null when off); sequence b's slopes by query head start at
  // base() + b * stride().
  const float* base() const { return base_; }
  int stride() const { return stride_; }
  // Sequence b's slopes by query head (b counts within this launch); null when off.
  const float* Row(int b) const {
    return base_ == nullptr ? nullptr : base_ + static_cast<int64_t>(b) * stride_;
  }

 private:
  static std::string Failed(const char* what, cudaError_t err) {
    return std::string(what) + " failed: " + cudaGetErrorString(err);
  }

  const float* base_ = nullptr;  // sequence 0 of this launch
  int stride_ = 0;
  float* owned_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace attnserve::kernels
