#include "server/engine/cuda_lane.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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
  return attributes.type == cudaMemoryTypeHost ? static_cast<const char*>(input[0].data)
                                               : nullptr;
}

}  // namespace

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
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
  ATTN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&lane->kernel_start_));
  ATTN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&lane->kernel_end_));
  return lane;
}

CudaLane::~CudaLane() {
  cudaSetDevice(ordinal_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (kernel_start_ != nullptr) cudaEventDestroy(kernel_start_);
  if (kernel_end_ != nullptr) cudaEventDestroy(kernel_end_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
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
  // Device memory: [inputs | outputs | workspace]. Pinned memory: [staged inputs | outputs]:
  // an input that arrived in page-locked memory (the data channel's receive buffers) crosses
  // PCIe from where it is, so it takes no staging space and is not copied once more; an
  // output with a destination takes none either.
  std::vector<size_t> input_offsets, input_sizes, staged_offsets, output_offsets;
  std::vector<const char*> in_place(inputs.size());
  size_t end = 0, staged_end = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    size_t size = 0;
    for (const HostBytes& piece : inputs[i]) size += piece.size;
    input_offsets.push_back(end);
    input_sizes.push_back(size);
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
  auto stage_launch_copy = [&]() -> absl::Status {
    const absl::Time stage_start = absl::Now();
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (input_sizes[i] == 0) continue;
      const char* source = in_place[i];
      if (source == nullptr) {
        gather_->Gather(inputs[i], pinned_ + staged_offsets[i]);
        source = pinned_ + staged_offsets[i];
      }
      // This input crosses PCIe while the next one is gathered.
      ATTN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(device + input_offsets[i], source,
                                                input_sizes[i], cudaMemcpyHostToDevice,
                                                stream_));
    }
    stage_end = absl::Now();
    run.stage_in_seconds = absl::ToDoubleSeconds(stage_end - stage_start);
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventRecord(kernel_start_, stream_));
    if (absl::Status s = launch(buffers, stream_); !s.ok()) return s;
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventRecord(kernel_end_, stream_));
    for (size_t i = 0; i < output_sizes.size(); ++i) {
      if (output_sizes[i] == 0) continue;
      ATTN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(output_hosts[i], device + output_offsets[i],
                                                output_sizes[i], cudaMemcpyDeviceToHost,
                                                stream_));
    }
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  };
  absl::Status status = stage_launch_copy();
  if (status.ok() && keep != nullptr) {
    // The stream was synchronized: the kept memory is ready for any stream.
    *keep = std::make_unique<KeptDeviceMemory>(ordinal_, device, end, buffers);
  } else {
    // Back to the pool even after an error (after the stream's work, which may still run).
    cudaFreeAsync(device, stream_);
  }
  if (!status.ok()) {
    // The next Run reuses the pinned buffer: nothing queued may still read or write it.
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    return status;
  }
  run.device_seconds = absl::ToDoubleSeconds(absl::Now() - stage_end);
  run.outputs.assign(output_hosts.begin(), output_hosts.end());
  cudaEventElapsedTime(&run.kernel_ms, kernel_start_, kernel_end_);
  return run;
}

}  // namespace attnserve::engine
