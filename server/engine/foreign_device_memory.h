// Device memory another process exported with cudaIpcGetMemHandle and this one opened: a
// co-located client's CUDA shared memory region, which kernels read and write where it lies.
// Closed (cudaIpcCloseMemHandle on its device) when the last holder lets go, so whoever drops
// it must be done with every use of it (lanes synchronize before they answer). A reset of its
// device (after a fault) unmaps it: valid() then says false, and it must not be used again.
#pragma once

#include <cstdint>
#include <functional>

namespace attnserve::engine {

class ForeignDeviceMemory {
 public:
  // `valid`: whether the mapping still stands (empty: always).
  ForeignDeviceMemory(int device, char* data, uint64_t bytes, std::function<void()> close,
                      std::function<bool()> valid = {})
      : device_(device),
        data_(data),
        bytes_(bytes),
        close_(std::move(close)),
        valid_(std::move(valid)) {}
  ~ForeignDeviceMemory() {
    if (close_) close_();
  }
  ForeignDeviceMemory(const ForeignDeviceMemory&) = delete;
  ForeignDeviceMemory& operator=(const ForeignDeviceMemory&) = delete;

  int device() const { return device_; }  // its CUDA ordinal in this process
  char* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  bool valid() const { return !valid_ || valid_(); }

 private:
  const int device_;
  char* const data_;
  const uint64_t bytes_;
  const std::function<void()> close_;
  const std::function<bool()> valid_;
};

}  // namespace attnserve::engine
