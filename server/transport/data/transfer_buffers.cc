#include "server/transport/data/transfer_buffers.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::transport::data {
namespace {

constexpr size_t kAlignment = 4096;

class HostBuffer final : public TransferBuffer {
 public:
  HostBuffer(char* data, size_t size) : data_(data), size_(size) {}
  ~HostBuffer() override { std::free(data_); }
  char* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  char* const data_;
  const size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferBuffer>> HostTransferBuffers::Allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment, and at least one byte.
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* memory = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("could not allocate a ", bytes, "-byte receive buffer"));
  }
  return std::make_unique<HostBuffer>(static_cast<char*>(memory), bytes);
}

}  // namespace attnserve::transport::data
