// A POSIX shared-memory object of this process (the client's side of Triton's system shared
// memory extension), and copies into and out of it split over a few threads.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace attnserve::internal {

class CallWorkers;

class ShmRegion {
 public:
  // Creates /attnserve-<pid>-<random> of `byte_size` bytes, its pages reserved (tmpfs
  // allocates pages on first touch; past /dev/shm's size, 64 MiB in a default Docker
  // container, that touch is a SIGBUS, so posix_fallocate makes it fail here instead) and
  // mapped. RESOURCE_EXHAUSTED when /dev/shm has no room, INTERNAL for other failures.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(int64_t byte_size);
  // Unmaps, and unlinks in the process that created it (a child forked from it leaves the
  // object to its owner); an object someone already removed is fine.
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  // The name the server knows it by ("attnserve-<pid>-<hex>") and its POSIX key ("/" + name).
  const std::string& name() const { return name_; }
  std::string key() const { return "/" + name_; }
  int64_t byte_size() const { return byte_size_; }
  char* data() const { return data_; }

 private:
  ShmRegion(std::string name, char* data, int64_t byte_size)
      : name_(std::move(name)), data_(data), byte_size_(byte_size), owner_(getpid()) {}
  const std::string name_;
  char* const data_;
  const int64_t byte_size_;
  const pid_t owner_;
};

// memcpy of `bytes` bytes; copies of several MiB are split into a few chunks, all but one run
// on `workers` while the calling thread copies the last (one thread copies ~10 GB/s, well
// under what memory allows). Returns when every chunk is done.
void CopyParallel(char* destination, const char* source, size_t bytes, CallWorkers& workers);

// The most threads one CopyParallel uses (the caller's included): the size of its pool.
inline constexpr int kCopyThreads = 4;

}  // namespace attnserve::internal
