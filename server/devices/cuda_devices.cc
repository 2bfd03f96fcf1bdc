#include "server/devices/cuda_devices.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace attnserve::devices {
namespace {

// nvidia-smi's form of a GPU's UUID, so operators and clients see one spelling.
std::string UuidText(const cudaUUID_t& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    absl::StrAppend(&text, absl::Hex(static_cast<unsigned char>(uuid.bytes[i]), absl::kZeroPad2));
  }
  return text;
}

}  // namespace

std::vector<DeviceDescription> ListCudaDevices() {
  int count = 0;
  // No driver or no GPU is a normal answer here (the server then runs on the CPU).
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  std::vector<DeviceDescription> gpus;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    DeviceDescription gpu;
    gpu.kind = DeviceKind::kCuda;
    gpu.ordinal = ordinal;
    gpu.name = absl::StrCat("cuda:", ordinal);
    gpu.model = prop.name;
    gpu.uuid = UuidText(prop.uuid);
    gpu.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
    gpu.memory_total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    gpu.memory_free_bytes = gpu.memory_total_bytes;  // refreshed by the device's worker
    gpu.shared_memory_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
    gpus.push_back(gpu);
  }
  return gpus;
}

}  // namespace attnserve::devices
