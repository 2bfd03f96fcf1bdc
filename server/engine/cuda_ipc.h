// Opens a co-located client's CUDA IPC memory handle on one device (Engine::
// OpenForeignDeviceMemory on a CUDA worker).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/foreign_device_memory.h"

namespace attnserve::engine {

// `ipc_handle`: the 64 bytes of a cudaIpcMemHandle_t. The handle names an allocation of the
// exporting process; at least `byte_size` bytes of it must lie from its start (INVALID_ARGUMENT
// otherwise, as for a handle that does not open). The memory is closed on device `ordinal`
// when the returned holder goes.
absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenIpcMemory(int ordinal,
                                                                   const std::string& ipc_handle,
                                                                   uint64_t byte_size);

}  // namespace attnserve::engine
