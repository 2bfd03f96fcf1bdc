#include "server/engine/cuda_ipc.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::engine {
namespace {

// The current device for a scope, restored after (gRPC threads call in with any current one).
class OnDevice {
 public:
  explicit OnDevice(int ordinal) {
    cudaGetDevice(&previous_);
    cudaSetDevice(ordinal);
  }
  ~OnDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// The size of the allocation `pointer` lies in, from `pointer` on; 0 when the driver cannot
// tell. The runtime has no such call: the driver's cuMemGetAddressRange, found through the
// runtime, so the server needs no link-time libcuda.
size_t BytesFrom(void* pointer) {
  using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || entry == nullptr) {
    cudaGetLastError();
    return 0;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(pointer);
  if (reinterpret_cast<AddressRangeFn>(entry)(&base, &size, at) != CUDA_SUCCESS) return 0;
  return base + size > at ? static_cast<size_t>(base + size - at) : 0;
}

// Resets of each device so far (NoteDeviceReset): a handle opened under one count is mapped
// only while the count stands.
constexpr int kMaxDevices = 64;
std::atomic<uint64_t> g_resets[kMaxDevices];

uint64_t Resets(int ordinal) {
  return ordinal >= 0 && ordinal < kMaxDevices ? g_resets[ordinal].load() : 0;
}

}  // namespace

void NoteDeviceReset(int ordinal) {
  if (ordinal >= 0 && ordinal < kMaxDevices) g_resets[ordinal].fetch_add(1);
}

absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenIpcMemory(int ordinal,
                                                                   const std::string& ipc_handle,
                                                                   uint64_t byte_size) {
  cudaIpcMemHandle_t handle;
  if (ipc_handle.size() != sizeof(handle)) {
    return absl::InvalidArgumentError(absl::StrCat("raw_handle: must be the ", sizeof(handle),
                                                   " bytes of a cudaIpcMemHandle_t, got ",
                                                   ipc_handle.size()));
  }
  if (byte_size == 0) return absl::InvalidArgumentError("byte_size: must be positive");
  std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
  OnDevice on(ordinal);
  void* pointer = nullptr;
  if (cudaError_t err = cudaIpcOpenMemHandle(&pointer, handle, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    cudaGetLastError();  // a bad handle leaves the device usable
    return absl::InvalidArgumentError(absl::StrCat("raw_handle: cannot open it on cuda:", ordinal,
                                                   ": ", cudaGetErrorString(err)));
  }
  if (const size_t available = BytesFrom(pointer); available < byte_size) {
    cudaIpcCloseMemHandle(pointer);
    return absl::InvalidArgumentError(
        absl::StrCat("byte_size: ", byte_size, " exceed the ", available,
                     " bytes of the exported allocation"));
  }
  const uint64_t opened_under = Resets(ordinal);
  auto mapped = [ordinal, opened_under] { return Resets(ordinal) == opened_under; };
  return std::make_shared<ForeignDeviceMemory>(
      ordinal, static_cast<char*>(pointer), byte_size,
      [ordinal, pointer, mapped] {
        if (!mapped()) return;  // the reset unmapped it, in a context that is gone
        OnDevice on(ordinal);
        cudaIpcCloseMemHandle(pointer);
      },
      mapped);
}

}  // namespace attnserve::engine
