// Gathers host pieces into one contiguous buffer with several threads. A lane stages every
// request byte into pinned memory before it crosses PCIe, and one thread's memcpy moved only
// ~5.5 GB/s there on the GPU machine (1.09 ms of a small request's 1.6 ms of lane time, 58 ms
// of a long backward's 233 ms: bench/RESULTS.md "Answer threads"), far below what the host's
// memory system delivers to several cores at once.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attnserve::engine {

struct HostBytes {
  const void* data;
  size_t size;
};

class ParallelCopier {
 public:
  // Below this many bytes the caller copies alone. Measured side by side on the GPU machine
  // (bench/RESULTS.md "Lane threads"): four threads took 1.26 ms to stage a small forward's
  // three 2 MB inputs against 1.09 ms for one (-7% req/s, the copies contend with gRPC and the
  // client for the cores), while a long sequence's 72 MB inputs staged in 19 instead of 52 ms
  // (+12% req/s).
  static constexpr size_t kMinParallelBytes = size_t{8} << 20;

  // `helpers` threads besides the caller's (0: the caller always copies alone).
  explicit ParallelCopier(int helpers);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  // Copies `pieces` back to back into `dst` and returns once every byte is there. One caller
  // at a time (a lane's own thread).
  void Gather(const std::vector<HostBytes>& pieces, char* dst);

 private:
  void HelperLoop(int share);

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  uint64_t generation_ = 0;   // bumped per parallel Gather
  int pending_ = 0;           // helpers still copying their share of it
  bool stopping_ = false;
  std::function<void(int)> copy_share_;  // share index -> copies that share of the bytes
  std::vector<std::thread> helpers_;
};

}  // namespace attnserve::engine
