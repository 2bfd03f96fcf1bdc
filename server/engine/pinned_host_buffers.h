// Page-locked host buffers (registered with cudaHostRegister) for the bytes transports receive on a GPU host, kept
// for reuse: pinning costs the driver about as long as moving the bytes over PCIe, so a fresh
// allocation per request would spend on pinning what it saves on staging.
#pragma once

#include <cstddef>
#include <memory>

#include "server/engine/host_buffers.h"

namespace attnserve::engine {

class PinnedHostBuffers final : public HostBuffers {
 public:
  // Freed buffers are kept for reuse up to `cache_bytes` in all.
  explicit PinnedHostBuffers(size_t cache_bytes);
  ~PinnedHostBuffers() override;

  // Page-locked memory when the driver gives it, else pageable (the lane then stages it, as it
  // does any other request).
  absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(size_t bytes) override;
  std::shared_ptr<void> PageLock(void* data, size_t bytes) override;

  struct Pool;  // shared with the buffers it lent, which may outlive this object

 private:
  std::shared_ptr<Pool> pool_;
  PageableHostBuffers fallback_;
};

}  // namespace attnserve::engine
