// Where a request's payload lands. A small interface so the engine can later hand out pinned
// (page-locked CUDA host) memory that its host-to-device copies read without staging; for
// now plain page-aligned host memory.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace attnserve::transport::data {

class TransferBuffer {
 public:
  virtual ~TransferBuffer() = default;
  virtual char* data() = 0;
  virtual size_t size() const = 0;
};

class TransferBuffers {
 public:
  virtual ~TransferBuffers() = default;
  // `bytes` of uninitialized memory; RESOURCE_EXHAUSTED when it cannot be had. Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<TransferBuffer>> Allocate(size_t bytes) = 0;
};

// 4 KiB-aligned host memory (page-aligned, so pinning it later or O_DIRECT-style copies work;
// untouched pages cost no RSS until their bytes arrive).
class HostTransferBuffers final : public TransferBuffers {
 public:
  absl::StatusOr<std::unique_ptr<TransferBuffer>> Allocate(size_t bytes) override;
};

}  // namespace attnserve::transport::data
