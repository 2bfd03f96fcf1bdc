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
// when the returned holder goes, and is no longer valid() once the device is reset.
absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenIpcMemory(int ordinal,
                                                                   const std::string& ipc_handle,
                                                                   uint64_t byte_size);

// Called before device `ordinal`'s context is reset (cudaDeviceReset): every handle opened on
// it is unmapped by the reset, so each becomes invalid and is not closed again.
void NoteDeviceReset(int ordinal);

}  // namespace attnserve::engine
