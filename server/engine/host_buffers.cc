#include "server/engine/host_buffers.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::engine {
namespace {

constexpr size_t kPageBytes = 4096;

class PageableBuffer final : public HostBuffer {
 public:
  PageableBuffer(char* data, size_t size) : data_(data), size_(size) {}
  ~PageableBuffer() override { std::free(data_); }
  char* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  char* const data_;
  const size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostBuffer>> PageableHostBuffers::Allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment, and at least one byte.
  const size_t rounded = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* memory = std::aligned_alloc(kPageBytes, rounded == 0 ? kPageBytes : rounded);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("could not allocate a ", bytes, "-byte host buffer"));
  }
  return std::make_unique<PageableBuffer>(static_cast<char*>(memory), bytes);
}

}  // namespace attnserve::engine
