// Triton's system shared memory extension: clients register POSIX shared-memory objects by
// key, offset and size, then name them in inference requests instead of sending tensor bytes.
// Off unless the server was started with --allow_shared_memory, since registering makes the
// server map memory a client chose. A region unused for `idle_timeout` is unmapped, so a
// client that goes away without unregistering leaves nothing mapped for long. A region in use
// by a call stays mapped until that call is done, even when unregistered meanwhile. Regions
// belong to the principal that registered them (the SHA-256 of its bearer token, as saved
// contexts do): another client can neither see, use nor unregister them, and two clients may
// each name a region "input".
#pragma once

#include <condition_variable>
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

namespace attnserve::transport::oip {

// One mapping of [offset, offset + byte_size) of a shared-memory object; unmapped when the
// last holder lets go.
class MappedRegion {
 public:
  MappedRegion(std::string name, std::string key, uint64_t offset, uint64_t byte_size,
               void* mapping, size_t mapping_bytes);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  uint64_t offset() const { return offset_; }
  uint64_t byte_size() const { return byte_size_; }
  // The registered bytes (the object's bytes from `offset` on).
  char* data() const { return static_cast<char*>(mapping_) + offset_; }

 private:
  const std::string name_, key_;
  const uint64_t offset_, byte_size_;
  void* const mapping_;
  const size_t mapping_bytes_;
};

struct SharedMemoryOptions {
  bool allowed = false;  // --allow_shared_memory
  absl::Duration idle_timeout = absl::Minutes(10);
  int64_t max_regions = 64;
};

class SystemSharedMemory {
 public:
  explicit SystemSharedMemory(SharedMemoryOptions options);
  ~SystemSharedMemory();

  bool allowed() const { return options_.allowed; }
  // Maps `byte_size` bytes of the object `key` from `offset` as `principal`'s region `name`.
  // FAILED_PRECONDITION when shared memory is off; ALREADY_EXISTS for a name in use;
  // INVALID_ARGUMENT for a key that is not "/name", an object that does not exist or is
  // smaller than offset + byte_size.
  absl::Status Register(const std::string& principal, const std::string& name,
                        const std::string& key, uint64_t offset, uint64_t byte_size);
  // Empty `name`: every region of `principal`. NOT_FOUND for an unknown name.
  absl::Status Unregister(const std::string& principal, const std::string& name);
  // Empty `name`: every region of `principal`; NOT_FOUND for an unknown name.
  absl::StatusOr<std::vector<std::shared_ptr<const MappedRegion>>> Status(
      const std::string& principal, const std::string& name);
  // `byte_size` bytes at `offset` of `principal`'s region `name`, which the returned holder
  // keeps mapped. Errors name `field` (e.g. "inputs[q].parameters") and say what did not fit.
  absl::StatusOr<std::shared_ptr<const MappedRegion>> Use(const std::string& principal,
                                                          const std::string& name,
                                                          uint64_t offset, uint64_t byte_size,
                                                          const std::string& field);

 private:
  struct Entry {
    std::shared_ptr<const MappedRegion> region;
    absl::Time last_used;
  };
  void SweepIdle();

  const SharedMemoryOptions options_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  using RegionKey = std::pair<std::string, std::string>;  // principal, name
  std::map<RegionKey, Entry> regions_;
  std::thread sweeper_;  // only when allowed
};

}  // namespace attnserve::transport::oip
