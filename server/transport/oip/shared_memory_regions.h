// Triton's shared-memory extensions: clients register regions, then name them in inference
// requests instead of sending tensor bytes. A system region is a POSIX shared-memory object
// (key, offset, size), mapped here; a CUDA region is device memory the client exported with
// cudaIpcGetMemHandle, opened here on its device (the engine opens it: kernels read and write
// it where it lies). One namespace holds both kinds, as in Triton. Off unless the server was
// started with --allow_shared_memory, since registering makes the server map memory a client
// chose. A region unused for `idle_timeout` is unmapped, so a client that goes away without
// unregistering leaves nothing mapped for long. A region in use by a call stays mapped until
// that call is done, even when unregistered meanwhile. Regions belong to the principal that
// registered them (the SHA-256 of its bearer token, as saved contexts do): another client can
// neither see, use nor unregister them, and two clients may each name a region "input".
#pragma once

#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/engine/foreign_device_memory.h"

namespace attnserve::transport::oip {

enum class RegionKind { kSystem, kCuda };
const char* RegionKindName(RegionKind kind);  // "system", "cuda" (the metrics' label)

// One registered region; unmapped (or closed) when the last holder lets go.
class MappedRegion {
 public:
  // A system region: [offset, offset + byte_size) of the object `key`, whose first
  // mapping_bytes are mapped at `mapping`.
  MappedRegion(std::string name, std::string key, uint64_t offset, uint64_t byte_size,
               void* mapping, size_t mapping_bytes, std::shared_ptr<void> page_lock);
  // A CUDA region: all of `memory`.
  MappedRegion(std::string name, std::shared_ptr<engine::ForeignDeviceMemory> memory);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  RegionKind kind() const { return device_memory_ ? RegionKind::kCuda : RegionKind::kSystem; }
  // False for a CUDA region whose device was reset since it was opened (its mapping is gone).
  bool valid() const { return !device_memory_ || device_memory_->valid(); }
  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }  // system regions
  uint64_t offset() const { return offset_; }      // system regions
  uint64_t byte_size() const { return byte_size_; }
  // The CUDA ordinal of a CUDA region's memory; -1 for a system region.
  int device() const { return device_memory_ ? device_memory_->device() : -1; }
  // The registered bytes (a system object's bytes from `offset` on; device memory).
  char* data() const {
    return device_memory_ ? device_memory_->data() : static_cast<char*>(mapping_) + offset_;
  }

 private:
  const std::string name_, key_;
  const uint64_t offset_, byte_size_;
  void* const mapping_;
  const size_t mapping_bytes_;
  const std::shared_ptr<engine::ForeignDeviceMemory> device_memory_;
  std::shared_ptr<void> page_lock_;  // released before the mapping goes
};

struct SharedMemoryOptions {
  bool allowed = false;  // --allow_shared_memory
  // Page-locks a system region's mapping for as long as it is registered (engine::HostBuffers::
  // PageLock: on a GPU host lanes then read and write it in place); may be empty.
  std::function<std::shared_ptr<void>(void* data, size_t bytes)> page_lock;
  absl::Duration idle_timeout = absl::Minutes(10);
  int64_t max_regions = 64;
};

class SharedMemoryRegions {
 public:
  using OpenDeviceMemory =
      std::function<absl::StatusOr<std::shared_ptr<engine::ForeignDeviceMemory>>()>;

  explicit SharedMemoryRegions(SharedMemoryOptions options);
  ~SharedMemoryRegions();

  bool allowed() const { return options_.allowed; }
  // Maps `byte_size` bytes of the object `key` from `offset` as `principal`'s region `name`.
  // FAILED_PRECONDITION when shared memory is off; ALREADY_EXISTS for a name in use (of either
  // kind); INVALID_ARGUMENT for a key that is not "/name", an object that does not exist or is
  // smaller than offset + byte_size.
  absl::Status RegisterSystem(const std::string& principal, const std::string& name,
                              const std::string& key, uint64_t offset, uint64_t byte_size);
  // Registers what `open` opens (once the name is known to be free) as `principal`'s CUDA
  // region `name`; the same refusals, and whatever `open` answers.
  absl::Status RegisterCuda(const std::string& principal, const std::string& name,
                            const OpenDeviceMemory& open);
  // Empty `name`: every region of `principal` of that kind. NOT_FOUND for an unknown name (or
  // one of the other kind).
  absl::Status Unregister(const std::string& principal, RegionKind kind, const std::string& name);
  absl::StatusOr<std::vector<std::shared_ptr<const MappedRegion>>> Status(
      const std::string& principal, RegionKind kind, const std::string& name);
  // `byte_size` bytes at `offset` of `principal`'s region `name` (either kind), which the
  // returned holder keeps mapped. Errors name `field` (e.g. "inputs[q].parameters") and say
  // what did not fit.
  absl::StatusOr<std::shared_ptr<const MappedRegion>> Use(const std::string& principal,
                                                          const std::string& name,
                                                          uint64_t offset, uint64_t byte_size,
                                                          const std::string& field);

 private:
  struct Entry {
    std::shared_ptr<const MappedRegion> region;
    absl::Time last_used;
  };
  using RegionKey = std::pair<std::string, std::string>;  // principal, name
  // Moves the regions whose device was reset (MappedRegion::valid) into `removed`, for the
  // caller to let go of once mu_ is released.
  void DropInvalid(std::map<RegionKey, Entry>* removed);
  // OK when `principal` may register `name` now (shared memory on, name free, room left).
  absl::Status CheckRegisterable(const std::string& principal, const std::string& name);
  absl::Status Insert(const std::string& principal, std::shared_ptr<const MappedRegion> region);
  void SweepIdle();

  const SharedMemoryOptions options_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::map<RegionKey, Entry> regions_;
  std::thread sweeper_;  // only when allowed
};

}  // namespace attnserve::transport::oip
