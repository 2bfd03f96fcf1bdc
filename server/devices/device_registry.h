// Which devices this server computes on: parses --devices and describes each device (name,
// model, compute capability, memory) for routing, ServerInfo and metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::devices {

enum class DeviceKind { kCpu, kCuda };

struct DeviceDescription {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;                 // CUDA ordinal; 0 for the CPU
  std::string name;                // "cpu" or "cuda:N"
  std::string model;               // "NVIDIA H100 80GB HBM3" or the CPU's model name
  std::string uuid;                // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; empty for the CPU
  std::string compute_capability;  // "9.0" as routed; empty for the CPU
  // The GPU's own capability when --emulate_compute_capability overrides compute_capability
  // (the kernels then run that older architecture's code paths); empty otherwise.
  std::string native_compute_capability;
  int64_t memory_total_bytes = 0;
  int64_t memory_free_bytes = 0;
  // The most shared memory a kernel block may opt into, in bytes (the router passes over
  // kernels that need more); under --emulate_compute_capability, what that architecture gives.
  // 0: unknown (the CPU, synthetic devices).
  int shared_memory_per_block = 0;
};

// Lists the GPUs the process can use: ListCudaDevices (cuda_devices.h) in CUDA builds,
// ListNoGpus otherwise; tests inject synthetic GPUs.
using GpuLister = std::function<std::vector<DeviceDescription>()>;
std::vector<DeviceDescription> ListNoGpus();

// The host CPU as a device: model name from /proc/cpuinfo, physical and available memory.
DeviceDescription DescribeCpu();

// Resolves a --devices value: "auto" (all GPUs, else the CPU), "cpu", or comma-separated
// CUDA ordinals ("0,1"). Unknown ordinals, duplicates and GPUs without execution support are
// errors that name the value.
absl::StatusOr<std::vector<DeviceDescription>> ResolveDevices(absl::string_view spec,
                                                             const GpuLister& list_gpus);

}  // namespace attnserve::devices
