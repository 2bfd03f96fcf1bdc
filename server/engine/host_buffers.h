// Host memory for request bytes that a transport receives itself (the data channel): the engine
// hands it out so that, on a GPU host, it is page-locked and a lane's host-to-device copy reads
// it in place (cuda_lane.cc) instead of staging every byte once more.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace attnserve::engine {

class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  virtual char* data() = 0;
  virtual size_t size() const = 0;
};

class HostBuffers {
 public:
  virtual ~HostBuffers() = default;
  // `bytes` of uninitialized memory, valid until the buffer is destroyed; RESOURCE_EXHAUSTED
  // when it cannot be had. Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(size_t bytes) = 0;
  // Page-locks memory a transport mapped itself (a client's system shared memory region) so
  // lanes read and write it in place, until the returned holder goes (drop it before the
  // memory). Null where nothing needs page-locking (no GPU) or the driver refused.
  virtual std::shared_ptr<void> PageLock(void* /*data*/, size_t /*bytes*/) { return nullptr; }
};

// Page-aligned pageable memory: what a host without GPUs needs, and untouched pages cost no
// resident memory until their bytes arrive.
class PageableHostBuffers final : public HostBuffers {
 public:
  absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(size_t bytes) override;
};

}  // namespace attnserve::engine
