// The current CUDA device as the GPU families see it when they plan a launch: its index, compute
// capability, opt-in shared memory per block and multiprocessor count. One cached query for
// every family.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace attnserve::kernels {

struct GpuDevice {
  int device = 0;
  int compute_capability = 0;  // major * 10 + minor
  int smem_optin = 0;          // bytes of shared memory a block may opt into
  int multiprocessors = 0;     // SMs: a persistent kernel launches at most one CTA per SM
};

// Fills *out for the calling thread's current device. The attributes are read once per device
// (cudaDeviceGetAttribute is not free at thousands of calls a second) and kept packed as
// (cc << 48 | multiprocessors << 32 | smem) + 1, 0 meaning not read yet. On failure returns the
// error and names the call that failed in *failed_call.
inline cudaError_t QueryCurrentGpu(GpuDevice* out, const char** failed_call) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<uint64_t> cache[kMaxCachedDevices] = {};
  *failed_call = "cudaGetDevice";
  cudaError_t err = cudaGetDevice(&out->device);
  if (err != cudaSuccess) return err;
  const bool cacheable = out->device >= 0 && out->device < kMaxCachedDevices;
  const uint64_t cached = cacheable ? cache[out->device].load(std::memory_order_relaxed) : 0;
  if (cached != 0) {
    out->compute_capability = static_cast<int>((cached - 1) >> 48);
    out->multiprocessors = static_cast<int>(((cached - 1) >> 32) & 0xffffu);
    out->smem_optin = static_cast<int>((cached - 1) & 0xffffffffu);
    return cudaSuccess;
  }
  *failed_call = "cudaDeviceGetAttribute";
  int major = 0;
  int minor = 0;
  int smem_optin = 0;
  int multiprocessors = 0;
  if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, out->device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, out->device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    out->device)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount,
                                    out->device)) != cudaSuccess) {
    return err;
  }
  out->compute_capability = major * 10 + minor;
  out->smem_optin = smem_optin;
  out->multiprocessors = multiprocessors;
  if (cacheable) {
    cache[out->device].store(((uint64_t{static_cast<uint32_t>(out->compute_capability)} << 48) |
                              (uint64_t{static_cast<uint32_t>(multiprocessors) & 0xffffu} << 32) |
                              static_cast<uint32_t>(smem_optin)) + 1,
                             std::memory_order_relaxed);
  }
  return cudaSuccess;
}

}  // namespace attnserve::kernels
