// One lane of a CUDA device worker: a stream, kernel-timing events, a pinned staging buffer and
// the threads that gather into it. Run() takes a request (or a batch of them) through the lane
// (RunSteps() one whose inputs arrive in parts, part by part):
// each input gathered from its pieces straight into pinned memory by several threads (or read
// where it is when it arrived in page-locked memory), its copy to the device issued at once so
// it overlaps the staging of the next, the kernel launch, every output back to where the
// caller wants it (memory it gave: host memory, page-locked when it can be, or device memory
// of a client's CUDA shared memory) or else to pinned memory
// for the caller to split. Device memory comes from the device's stream-ordered
// pool and goes back to it whatever happens.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/parallel_copy.h"

namespace attnserve::engine {

// A CUDA error as a status naming the call; out-of-memory is RESOURCE_EXHAUSTED, so only the
// request that hit it fails and its client can tell why; a sticky error is a device fault
// (device_fault.h: UNAVAILABLE, and the device goes out of service until it is reset).
absl::Status CudaStatus(cudaError_t err, const char* what);

// One device input: the concatenation of its pieces (one tensor, or a batch's parts' tensors).
using GatheredInput = std::vector<HostBytes>;

// What a Run leaves: where its outputs are (the caller's destinations, or the lane's pinned
// memory, valid until the lane's next Run) and where the time went.
struct LaneRun {
  std::vector<const char*> outputs;
  float kernel_ms = 0;          // between the timing events around each `launch`, summed
  double stage_in_seconds = 0;  // gathering inputs into pinned memory (copies overlap it)
  double device_seconds = 0;    // then waiting for the transfers and kernels
};

// Device addresses of one run's segments, in the order they were given.
struct DeviceBuffers {
  std::vector<char*> inputs;
  std::vector<char*> outputs;
  char* workspace = nullptr;
};

// Device memory a Run left allocated for its caller (a kept forward's inputs and outputs: its
// saved context), at the addresses its launch saw. Run synchronized its stream, so any stream
// may use it. The destructor frees it from any thread (cudaSetDevice first); whoever drops the
// last reference must have finished every use of it (lanes synchronize before they return).
class KeptDeviceMemory {
 public:
  KeptDeviceMemory(int ordinal, char* base, size_t bytes, DeviceBuffers buffers)
      : ordinal_(ordinal), base_(base), bytes_(bytes), buffers_(std::move(buffers)) {}
  ~KeptDeviceMemory();
  KeptDeviceMemory(const KeptDeviceMemory&) = delete;
  KeptDeviceMemory& operator=(const KeptDeviceMemory&) = delete;

  size_t bytes() const { return bytes_; }
  const DeviceBuffers& buffers() const { return buffers_; }

 private:
  const int ordinal_;
  char* const base_;
  const size_t bytes_;
  const DeviceBuffers buffers_;
};

// An input's bytes [begin, end) that cross to the device in one step of a run.
struct ByteRange {
  size_t begin = 0, end = 0;
};

// An output's bytes that come back in one step: `rows` runs of `width` bytes, `pitch` apart,
// from `offset`; the same layout on the device and at the destination (one run for a range of
// rows, a run per head for lse's [heads, total_q] columns of some query rows).
struct OutputBlock {
  size_t offset = 0, width = 0, rows = 1, pitch = 0;
};

// One step of a run in steps (a request whose inputs arrive group by group): once `ready`
// returns OK, its input ranges cross to the device, `launch` enqueues its kernels, its output
// blocks come back, and `done` runs when they are at their destinations.
struct LaneStep {
  std::function<absl::Status()> ready;  // may be empty; blocks until the step's bytes are in
  std::vector<ByteRange> inputs;        // one per input
  std::function<absl::Status(const DeviceBuffers&, cudaStream_t)> launch;
  // May be empty. Set: once the step's inputs are on their way, the lane waits until the
  // previous step's kernels have finished and then calls it; an error ends the run there, so
  // a request split into launches (launch_split.h) stops between them when its deadline
  // passes or its caller leaves, with at most this step's copies still to finish. The wait
  // leaves the device idle between the launches for the host's turnaround (tens of
  // microseconds against a slice of a quarter second); unset, steps queue without waiting.
  std::function<absl::Status()> before_launch;
  std::vector<OutputBlock> outputs;  // one per output
  // May be empty. Runs on a CUDA driver thread, in step order, before Run returns: it must not
  // call CUDA and must not block.
  std::function<void()> done;
};

class CudaLane {
 public:
  // stage_threads: threads that gather inputs into pinned memory (the lane's own and helpers).
  static absl::StatusOr<std::unique_ptr<CudaLane>> Create(int ordinal, int stage_threads);
  ~CudaLane();

  int ordinal() const { return ordinal_; }

  // Copies `inputs` to the device, calls `launch` (which enqueues kernels on `stream` between
  // the timing events), copies back `output_sizes` bytes per output, and waits. Inputs already
  // on this device need no segment: `launch` reads them where they are. With `keep`, a
  // successful run leaves its device memory allocated and hands it over there. Output i goes
  // to `destinations[i]` where given and not null (host memory, which may be an input's own
  // bytes: every input has crossed to the device before any output comes back), else to the
  // lane's pinned memory.
  absl::StatusOr<LaneRun> Run(
      const std::vector<GatheredInput>& inputs, const std::vector<size_t>& output_sizes,
      size_t workspace_bytes,
      const std::function<absl::Status(const DeviceBuffers&, cudaStream_t)>& launch,
      std::unique_ptr<KeptDeviceMemory>* keep = nullptr,
      const std::vector<char*>& destinations = {});

  // The same in steps, one after another on the lane's stream: step s's inputs cross while
  // step s-1 computes and its outputs come back, so a request computes while it still arrives
  // and answers while it still computes. The steps' input ranges and output blocks together
  // cover what crosses; an output with a destination gets at most its own bytes' ranges of an
  // input overlaid (out over q: a step's q rows crossed before its out rows come back).
  absl::StatusOr<LaneRun> RunSteps(const std::vector<GatheredInput>& inputs,
                                   const std::vector<size_t>& output_sizes, size_t workspace_bytes,
                                   const std::vector<LaneStep>& steps,
                                   std::unique_ptr<KeptDeviceMemory>* keep = nullptr,
                                   const std::vector<char*>& destinations = {});

 private:
  CudaLane() = default;
  absl::Status ReservePinned(size_t bytes);
  absl::Status ReserveEvents(size_t count);

  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // kernel timing: a start and an end per step
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::unique_ptr<ParallelCopier> gather_;
};

}  // namespace attnserve::engine
