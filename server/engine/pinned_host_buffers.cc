#include "server/engine/pinned_host_buffers.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

namespace attnserve::engine {
namespace {

// Sizes are rounded up to this, so requests of nearly the same size share cached buffers.
constexpr size_t kGranuleBytes = size_t{2} << 20;
constexpr size_t kPageBytes = 4096;

size_t RoundUp(size_t bytes) {
  return (bytes + kGranuleBytes - 1) / kGranuleBytes * kGranuleBytes;
}

// Host memory of our own, page-locked by registering it (portable: any device's lane may read
// it; multi-GPU hosts place requests anywhere), or null. Not cudaHostAlloc: that memory belongs
// to the context current on the allocating thread, and resetting that device after a fault
// (cuda_worker_faults.cc) would free it under the transports; registered memory stays ours and
// is at worst no longer page-locked (lanes then stage it, as any pageable request).
char* PinNew(size_t bytes) {
  void* memory = std::aligned_alloc(kPageBytes, bytes);
  if (memory == nullptr) return nullptr;
  if (cudaHostRegister(memory, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // out of page-locked memory is not sticky
    std::free(memory);
    return nullptr;
  }
  return static_cast<char*>(memory);
}

void Unpin(char* memory) {
  // Fails harmlessly when a reset of the registering context already dropped the registration.
  if (cudaHostUnregister(memory) != cudaSuccess) cudaGetLastError();
  std::free(memory);
}

}  // namespace

struct PinnedHostBuffers::Pool {
  explicit Pool(size_t cache_bytes) : cache_bytes(cache_bytes) {}
  ~Pool() {
    for (auto& [size, memory] : free_buffers) Unpin(memory);
  }

  // A cached buffer of at least `bytes` and at most a quarter more (a larger one would hold
  // memory the request does not use), or null.
  char* Take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = free_buffers.lower_bound(bytes);
    if (it == free_buffers.end() || it->first > bytes + bytes / 4) return nullptr;
    char* memory = it->second;
    cached -= it->first;
    free_buffers.erase(it);
    return memory;
  }

  // Keeps `memory` for reuse; beyond the cache's size the largest buffers go back to the driver.
  void Give(char* memory, size_t bytes) {
    std::multimap<size_t, char*> to_free;
    {
      std::lock_guard<std::mutex> lock(mu);
      free_buffers.emplace(bytes, memory);
      cached += bytes;
      while (cached > cache_bytes && !free_buffers.empty()) {
        auto largest = std::prev(free_buffers.end());
        cached -= largest->first;
        to_free.insert(*largest);
        free_buffers.erase(largest);
      }
    }
    for (auto& [size, buffer] : to_free) Unpin(buffer);
  }

  const size_t cache_bytes;
  std::mutex mu;
  std::multimap<size_t, char*> free_buffers;  // by size
  size_t cached = 0;
};

namespace {

class PinnedBuffer final : public HostBuffer {
 public:
  PinnedBuffer(std::shared_ptr<PinnedHostBuffers::Pool> pool, char* data, size_t capacity,
               size_t size)
      : pool_(std::move(pool)), data_(data), capacity_(capacity), size_(size) {}
  ~PinnedBuffer() override { pool_->Give(data_, capacity_); }
  char* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  const std::shared_ptr<PinnedHostBuffers::Pool> pool_;
  char* const data_;
  const size_t capacity_;
  const size_t size_;
};

}  // namespace

PinnedHostBuffers::PinnedHostBuffers(size_t cache_bytes)
    : pool_(std::make_shared<Pool>(cache_bytes)) {}

PinnedHostBuffers::~PinnedHostBuffers() = default;

absl::StatusOr<std::unique_ptr<HostBuffer>> PinnedHostBuffers::Allocate(size_t bytes) {
  const size_t capacity = RoundUp(bytes == 0 ? 1 : bytes);
  char* memory = pool_->Take(capacity);
  if (memory == nullptr) memory = PinNew(capacity);
  if (memory == nullptr) return fallback_.Allocate(bytes);  // serve it pageable
  return std::make_unique<PinnedBuffer>(pool_, memory, capacity, bytes);
}

std::shared_ptr<void> PinnedHostBuffers::PageLock(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return nullptr;
  if (cudaHostRegister(data, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky: the lanes stage this memory as any pageable request's
    return nullptr;
  }
  return std::shared_ptr<void>(data, [](void* locked) {
    if (cudaHostUnregister(locked) != cudaSuccess) cudaGetLastError();
  });
}

}  // namespace attnserve::engine
