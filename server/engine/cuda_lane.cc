#include "server/engine/cuda_lane.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/engine/cuda_fault.h"
#include "server/engine/device_fault.h"

namespace attnserve::engine {
namespace {

// Segments start 256-byte aligned (cudaMalloc's own alignment), where vectorized kernel loads
// expect tensors to start.
constexpr size_t kSegmentAlignment = 256;

// Smaller inputs are staged anyway: the pointer query costs about as much as copying them.
constexpr size_t kMinPinnedSourceBytes = size_t{64} << 10;

size_t AlignUp(size_t n) {
  return (n + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment;
}

#define ATTN_RETURN_IF_CUDA_ERROR(call)                                   \
  do {                                                                    \
    if (absl::Status _s = CudaStatus((call), #call); !_s.ok()) return _s; \
  } while (0)

// The input's bytes when they are one piece of page-locked host memory, which the copy engine
// reads at full speed without staging; null otherwise.
const char* PinnedSource(const GatheredInput& input) {
  if (input.size() != 1 || input[0].size < kMinPinnedSourceBytes) return nullptr;
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, input[0].data) != cudaSuccess) {
    cudaGetLastError();  // pageable memory is no error worth keeping
    return nullptr;
  }
  return attributes.type == cudaMemoryTypeHost ? static_cast<const char*>(input[0].data) : nullptr;
}

size_t TotalSize(const GatheredInput& input) {
  size_t size = 0;
  for (const HostBytes& piece : input) size += piece.size;
  return size;
}

// The pieces of `input` that hold its bytes [range.begin, range.end).
GatheredInput Slice(const GatheredInput& input, ByteRange range) {
  if (range.begin == 0 && range.end == TotalSize(input)) return input;
  GatheredInput slice;
  size_t at = 0;
  for (const HostBytes& piece : input) {
    const size_t begin = std::max(range.begin, at), end = std::min(range.end, at + piece.size);
    if (begin < end)
      slice.push_back({static_cast<const char*>(piece.data) + (begin - at), end - begin});
    at += piece.size;
  }
  return slice;
}

// Below this many bytes, staged inputs that lie side by side cross in one copy: a small
// request's copies cost more in API calls than in bytes. Larger ones cross one by one, each
// while the next is gathered.
constexpr size_t kMaxMergedStagedBytes = size_t{1} << 20;

// A host-to-device copy still to be issued, which the next input's may extend: inputs that
// arrived side by side in one page-locked buffer (q, k, v of a data channel request) and lie
// side by side on the device, or small staged ones (the staging buffer and the device
// segments are laid out alike, so the padding between them is the staging buffer's own).
struct HostToDevice {
  const char* source = nullptr;
  char* target = nullptr;
  size_t bytes = 0;
  bool staged = false;

  bool Extend(const HostToDevice& next) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(source) + bytes;
    const uintptr_t next_source = reinterpret_cast<uintptr_t>(next.source);
    if (bytes == 0 || next.staged != staged || next_source < end) return false;
    const size_t gap = next_source - end;
    const bool side_by_side =
        reinterpret_cast<uintptr_t>(next.target) - reinterpret_cast<uintptr_t>(target) ==
        next_source - reinterpret_cast<uintptr_t>(source);
    const bool mergeable = staged ? bytes + gap + next.bytes <= kMaxMergedStagedBytes : gap == 0;
    if (!side_by_side || !mergeable) return false;
    bytes += gap + next.bytes;
    return true;
  }
  cudaError_t Issue(cudaStream_t stream) const {
    if (bytes == 0) return cudaSuccess;
    return cudaMemcpyAsync(target, source, bytes, cudaMemcpyHostToDevice, stream);
  }
};

void CUDART_CB RunDone(void* done) { (*static_cast<std::function<void()>*>(done))(); }

}  // namespace

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  if (IsStickyCudaError(err)) {
    // Every later call on this device fails too: the worker takes it out of service.
    return DeviceFaultError(absl::StrCat(what, ": ", cudaGetErrorString(err),
                                         " (sticky: the device needs a reset)"));
  }
  cudaGetLastError();  // clear a non-sticky error so the next request starts clean
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": device out of memory"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

KeptDeviceMemory::~KeptDeviceMemory() {
  // Freed on this thread's per-thread stream: every use has finished, so nothing orders it;
  // the memory goes back to the device's pool (which keeps it for the next requests) at once.
  // The caller's current device is restored, as it may be a lane of another device.
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(ordinal_);
  cudaFreeAsync(base_, cudaStreamPerThread);
  if (previous >= 0 && previous != ordinal_) cudaSetDevice(previous);
}

absl::StatusOr<std::unique_ptr<CudaLane>> CudaLane::Create(int ordinal, int stage_threads) {
  std::unique_ptr<CudaLane> lane(new CudaLane());
  lane->gather_ = std::make_unique<ParallelCopier>(std::max(0, stage_threads - 1));
  lane->ordinal_ = ordinal;
  ATTN_RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal));
  ATTN_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&lane->stream_, cudaStreamNonBlocking));
  if (absl::Status s = lane->ReserveEvents(2); !s.ok()) return s;
  return lane;
}

CudaLane::~CudaLane() {
  cudaSetDevice(ordinal_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaLane::ReserveEvents(size_t count) {
  while (events_.size() < count) {
    cudaEvent_t event;
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&event));
    events_.push_back(event);
  }
  return absl::OkStatus();
}

absl::Status CudaLane::ReservePinned(size_t bytes) {
  if (bytes <= pinned_bytes_) return absl::OkStatus();
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  pinned_ = nullptr;
  pinned_bytes_ = 0;
  ATTN_RETURN_IF_CUDA_ERROR(
      cudaHostAlloc(reinterpret_cast<void**>(&pinned_), bytes, cudaHostAllocDefault));
  pinned_bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<LaneRun> CudaLane::Run(
    const std::vector<GatheredInput>& inputs, const std::vector<size_t>& output_sizes,
    size_t workspace_bytes,
    const std::function<absl::Status(const DeviceBuffers&, cudaStream_t)>& launch,
    std::unique_ptr<KeptDeviceMemory>* keep, const std::vector<char*>& destinations) {
  LaneStep whole;
  for (const GatheredInput& input : inputs) whole.inputs.push_back({0, TotalSize(input)});
  whole.launch = launch;
  for (size_t size : output_sizes) whole.outputs.push_back({0, size, 1, size});
  return RunSteps(inputs, output_sizes, workspace_bytes, {whole}, keep, destinations);
}

absl::StatusOr<LaneRun> CudaLane::RunSteps(const std::vector<GatheredInput>& inputs,
                                           const std::vector<size_t>& output_sizes,
                                           size_t workspace_bytes,
                                           const std::vector<LaneStep>& steps,
                                           std::unique_ptr<KeptDeviceMemory>* keep,
                                           const std::vector<char*>& destinations) {
  // Device memory: [inputs | outputs | workspace]. Pinned memory: [staged inputs | outputs]:
  // an input that arrived in page-locked memory (the data channel's receive buffers) crosses
  // PCIe from where it is, so it takes no staging space and is not copied once more; an
  // output with a destination takes none either.
  std::vector<size_t> input_offsets, staged_offsets, output_offsets;
  std::vector<const char*> in_place(inputs.size());
  size_t end = 0, staged_end = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t size = TotalSize(inputs[i]);
    input_offsets.push_back(end);
    end += AlignUp(size);
    in_place[i] = PinnedSource(inputs[i]);
    staged_offsets.push_back(staged_end);
    if (in_place[i] == nullptr) staged_end += AlignUp(size);
  }
  std::vector<size_t> pinned_output_offsets;
  size_t pinned_end = staged_end;
  for (size_t i = 0; i < output_sizes.size(); ++i) {
    output_offsets.push_back(end);
    end += AlignUp(output_sizes[i]);
    pinned_output_offsets.push_back(pinned_end);
    if (i >= destinations.size() || destinations[i] == nullptr) {
      pinned_end += AlignUp(output_sizes[i]);
    }
  }
  const size_t workspace_offset = end;
  end += AlignUp(workspace_bytes);

  if (absl::Status s = ReservePinned(pinned_end); !s.ok()) return s;
  if (absl::Status s = ReserveEvents(2 * steps.size()); !s.ok()) return s;
  std::vector<char*> output_hosts;
  for (size_t i = 0; i < output_sizes.size(); ++i) {
    const bool given = i < destinations.size() && destinations[i] != nullptr;
    output_hosts.push_back(given ? destinations[i] : pinned_ + pinned_output_offsets[i]);
  }
  char* device = nullptr;
  ATTN_RETURN_IF_CUDA_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&device), end, stream_));
  DeviceBuffers buffers;
  for (size_t offset : input_offsets) buffers.inputs.push_back(device + offset);
  for (size_t offset : output_offsets) buffers.outputs.push_back(device + offset);
  buffers.workspace = workspace_bytes > 0 ? device + workspace_offset : nullptr;

  LaneRun run;
  absl::Time stage_end = absl::Now();
  auto run_step = [&](size_t s) -> absl::Status {
    const LaneStep& step = steps[s];
    if (step.ready) {
      if (absl::Status arrived = step.ready(); !arrived.ok()) return arrived;
    }
    const absl::Time stage_start = absl::Now();
    HostToDevice pending;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ByteRange range = step.inputs[i];
      if (range.end <= range.begin) continue;
      const bool staged = in_place[i] == nullptr;
      const HostToDevice copy{(staged ? pinned_ + staged_offsets[i] : in_place[i]) + range.begin,
                              device + input_offsets[i] + range.begin, range.end - range.begin,
                              staged};
      if (!pending.Extend(copy)) {
        // The pending range crosses PCIe while this one is gathered.
        ATTN_RETURN_IF_CUDA_ERROR(pending.Issue(stream_));
        pending = copy;
      }
      if (staged) gather_->Gather(Slice(inputs[i], range), const_cast<char*>(copy.source));
    }
    ATTN_RETURN_IF_CUDA_ERROR(pending.Issue(stream_));
    stage_end = absl::Now();
    run.stage_in_seconds += absl::ToDoubleSeconds(stage_end - stage_start);
    if (step.before_launch) {
      if (s > 0) ATTN_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(events_[2 * s - 1]));
      if (absl::Status go = step.before_launch(); !go.ok()) return go;
    }
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventRecord(events_[2 * s], stream_));
    if (absl::Status launched = step.launch(buffers, stream_); !launched.ok()) return launched;
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventRecord(events_[2 * s + 1], stream_));
    for (size_t i = 0; i < output_sizes.size(); ++i) {
      const OutputBlock& block = step.outputs[i];
      if (block.width == 0 || block.rows == 0) continue;
      char* host = output_hosts[i] + block.offset;
      const char* source = device + output_offsets[i] + block.offset;
      // One run as a plain copy: a 2D copy's pitch may not exceed the device's memPitch (2 GB).
      // The destination may be device memory too (a client's CUDA shared memory): the kind
      // follows the addresses.
      ATTN_RETURN_IF_CUDA_ERROR(
          block.rows == 1
              ? cudaMemcpyAsync(host, source, block.width, cudaMemcpyDefault, stream_)
              : cudaMemcpy2DAsync(host, block.pitch, source, block.pitch, block.width, block.rows,
                                  cudaMemcpyDefault, stream_));
    }
    if (step.done) {
      ATTN_RETURN_IF_CUDA_ERROR(
          cudaLaunchHostFunc(stream_, RunDone, const_cast<std::function<void()>*>(&step.done)));
    }
    return absl::OkStatus();
  };
  absl::Status status;
  for (size_t s = 0; s < steps.size() && status.ok(); ++s) status = run_step(s);
  // Waiting spins (CUDA's default with fewer contexts than cores): a blocking-sync event cost
  // small requests 30% of their throughput (bench/RESULTS.md "Small requests").
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (status.ok() && keep != nullptr) {
    // The stream was synchronized: the kept memory is ready for any stream.
    *keep = std::make_unique<KeptDeviceMemory>(ordinal_, device, end, buffers);
  } else {
    // Back to the pool even after an error (after the stream's work, which may still run).
    cudaFreeAsync(device, stream_);
  }
  if (!status.ok()) {
    // The next Run reuses the pinned buffer, and the steps' `done` may still be queued: nothing
    // queued may outlive this call.
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    return status;
  }
  run.device_seconds = absl::ToDoubleSeconds(absl::Now() - stage_end);
  run.outputs.assign(output_hosts.begin(), output_hosts.end());
  for (size_t s = 0; s < steps.size(); ++s) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, events_[2 * s], events_[2 * s + 1]) == cudaSuccess) {
      run.kernel_ms += ms;
    }
  }
  return run;
}

}  // namespace attnserve::engine
