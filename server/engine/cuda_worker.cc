#include "server/engine/cuda_worker.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/flash/flash_attention.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {
namespace {

// Device and pinned buffers are carved into 256-byte aligned segments (cudaMalloc's own
// alignment), so every tensor starts where vectorized kernel loads expect.
constexpr size_t kSegmentAlignment = 256;

// Two lanes keep the copy engines and the SMs busy at once: while one request's inputs cross
// PCIe, the other's kernel runs.
constexpr int kLanesPerDevice = 2;

size_t AlignUp(size_t n) { return (n + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment; }

absl::Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so the next request starts clean
  if (err == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": device out of memory"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

#define ATTN_RETURN_IF_CUDA_ERROR(call)                                  \
  do {                                                                   \
    if (absl::Status _s = CudaError((call), #call); !_s.ok()) return _s; \
  } while (0)

// Where each tensor of one forward request sits, identically in pinned and device memory, so
// one copy moves all inputs in and one moves all outputs out.
struct ForwardLayout {
  size_t q, k, v, cu_q, cu_k, inputs_end;
  size_t out, lse, end;
};

ForwardLayout LayOut(const ForwardInputs& in, size_t lse_bytes) {
  ForwardLayout l;
  l.q = 0;
  l.k = l.q + AlignUp(in.q.size_bytes);
  l.v = l.k + AlignUp(in.k.size_bytes);
  l.cu_q = l.v + AlignUp(in.v.size_bytes);
  l.cu_k = l.cu_q + AlignUp(in.cu_seqlens_q.size() * sizeof(int32_t));
  l.inputs_end = l.cu_k + AlignUp(in.cu_seqlens_k.size() * sizeof(int32_t));
  l.out = l.inputs_end;
  l.lse = l.out + AlignUp(in.q.size_bytes);
  l.end = l.lse + AlignUp(lse_bytes);
  return l;
}

int MaxLength(const std::vector<int32_t>& cu) {
  int longest = 0;
  for (size_t i = 1; i < cu.size(); ++i) longest = std::max(longest, cu[i] - cu[i - 1]);
  return longest;
}

}  // namespace

// One lane: its stream, kernel timing events and pinned staging buffer (grown to the largest
// request it has carried).
struct CudaWorker::Lane {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t kernel_start = nullptr, kernel_end = nullptr;
  char* pinned = nullptr;
  size_t pinned_bytes = 0;

  static absl::StatusOr<std::unique_ptr<Lane>> Create(int ordinal) {
    auto lane = std::make_unique<Lane>();
    lane->ordinal = ordinal;
    ATTN_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&lane->kernel_start));
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&lane->kernel_end));
    return lane;
  }

  absl::Status ReservePinned(size_t bytes) {
    if (bytes <= pinned_bytes) return absl::OkStatus();
    if (pinned != nullptr) cudaFreeHost(pinned);
    pinned = nullptr;
    pinned_bytes = 0;
    ATTN_RETURN_IF_CUDA_ERROR(
        cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes, cudaHostAllocDefault));
    pinned_bytes = bytes;
    return absl::OkStatus();
  }

  ~Lane() {
    cudaSetDevice(ordinal);
    if (pinned != nullptr) cudaFreeHost(pinned);
    if (kernel_start != nullptr) cudaEventDestroy(kernel_start);
    if (kernel_end != nullptr) cudaEventDestroy(kernel_end);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

absl::StatusOr<std::unique_ptr<CudaWorker>> CudaWorker::Create(devices::DeviceDescription device,
                                                               const EngineOptions& options,
                                                               metrics::ServerMetrics* metrics) {
  ATTN_RETURN_IF_CUDA_ERROR(cudaSetDevice(device.ordinal));
  // Keep freed device memory in the pool instead of returning it to the driver after every
  // request: requests of similar sizes then allocate without a driver call.
  cudaMemPool_t pool;
  ATTN_RETURN_IF_CUDA_ERROR(cudaDeviceGetDefaultMemPool(&pool, device.ordinal));
  uint64_t keep_everything = UINT64_MAX;
  ATTN_RETURN_IF_CUDA_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  std::vector<std::unique_ptr<Lane>> lanes;
  for (int i = 0; i < kLanesPerDevice; ++i) {
    absl::StatusOr<std::unique_ptr<Lane>> lane = Lane::Create(device.ordinal);
    if (!lane.ok()) return lane.status();
    lanes.push_back(*std::move(lane));
  }
  return std::unique_ptr<CudaWorker>(
      new CudaWorker(std::move(device), options, metrics, std::move(lanes)));
}

CudaWorker::CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
                       metrics::ServerMetrics* metrics, std::vector<std::unique_ptr<Lane>> lanes)
    : QueueWorker(device, options.batching, metrics),
      lanes_(std::move(lanes)),
      cpu_context_{options.cpu_threads},
      compute_capability_(std::stoi(device.compute_capability) * 10 +
                          std::stoi(device.compute_capability.substr(
                              device.compute_capability.find('.') + 1))),
      metrics_(metrics) {
  StartLanes(static_cast<int>(lanes_.size()));
}

CudaWorker::~CudaWorker() { Stop(); }

std::vector<std::string> CudaWorker::kernel_families() const {
  if (compute_capability_ >= 80) return {"flash", kReferenceFamily.name};
  return {kReferenceFamily.name};
}

void CudaWorker::OnLaneStart(int lane) { cudaSetDevice(lanes_[lane]->ordinal); }

bool CudaWorker::FlashCanRun(const TensorView& q) const {
  const int64_t head_dim = q.shape[2];
  return compute_capability_ >= 80 && q.dtype != DType::kFloat32 && head_dim % 8 == 0 &&
         head_dim <= 256;
}

absl::StatusOr<ForwardResult> CudaWorker::Execute(const ForwardInputs& inputs, int lane) {
  if (FlashCanRun(inputs.q) && inputs.q.shape[0] > 0) {
    return RunFlashForward(inputs, *lanes_[lane]);
  }
  // No GPU family covers this request (yet): the exact CPU kernels answer it.
  absl::StatusOr<ForwardResult> result = RunForward(kReferenceFamily, inputs, cpu_context_);
  if (result.ok()) result->execution.device = "cpu";
  return result;
}

absl::StatusOr<BackwardResult> CudaWorker::Execute(const BackwardInputs& inputs, int /*lane*/) {
  absl::StatusOr<BackwardResult> result = RunBackward(kReferenceFamily, inputs, cpu_context_);
  if (result.ok()) result->execution.device = "cpu";
  return result;
}

absl::StatusOr<ForwardResult> CudaWorker::RunFlashForward(const ForwardInputs& in, Lane& lane) {
  const int num_heads = static_cast<int>(in.q.shape[1]);
  const int64_t total_q = in.q.shape[0];
  const size_t lse_bytes = sizeof(float) * num_heads * total_q;
  const ForwardLayout layout = LayOut(in, lse_bytes);
  if (absl::Status s = lane.ReservePinned(layout.end); !s.ok()) return s;

  char* host = lane.pinned;
  std::memcpy(host + layout.q, in.q.data, in.q.size_bytes);
  std::memcpy(host + layout.k, in.k.data, in.k.size_bytes);
  std::memcpy(host + layout.v, in.v.data, in.v.size_bytes);
  std::memcpy(host + layout.cu_q, in.cu_seqlens_q.data(), in.cu_seqlens_q.size() * 4);
  std::memcpy(host + layout.cu_k, in.cu_seqlens_k.data(), in.cu_seqlens_k.size() * 4);

  cudaStream_t stream = lane.stream;
  char* device = nullptr;
  ATTN_RETURN_IF_CUDA_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&device), layout.end, stream));
  // From here on the device buffer must go back to the pool whatever happens.
  auto run = [&]() -> absl::Status {
    ATTN_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(device, host, layout.inputs_end, cudaMemcpyHostToDevice, stream));
    kernels::ForwardParams params;
    params.shape.dtype = in.q.dtype;
    params.shape.batch = static_cast<int>(in.cu_seqlens_q.size()) - 1;
    params.shape.total_q = total_q;
    params.shape.total_k = in.k.shape[0];
    params.shape.num_heads = num_heads;
    params.shape.num_heads_k = static_cast<int>(in.k.shape[1]);
    params.shape.head_dim = static_cast<int>(in.q.shape[2]);
    params.shape.cu_seqlens_q = in.cu_seqlens_q.data();
    params.shape.cu_seqlens_k = in.cu_seqlens_k.data();
    params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(device + layout.cu_q);
    params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(device + layout.cu_k);
    params.shape.max_seqlen_q = MaxLength(in.cu_seqlens_q);
    params.shape.max_seqlen_k = MaxLength(in.cu_seqlens_k);
    params.options = ResolveOptions(in.options, params.shape.head_dim);
    params.q = device + layout.q;
    params.k = device + layout.k;
    params.v = device + layout.v;
    params.out = device + layout.out;
    params.lse = reinterpret_cast<float*>(device + layout.lse);
    kernels::ExecutionContext ctx;
    ctx.stream = stream;
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventRecord(lane.kernel_start, stream));
    kernels::KernelStatus status = kernels::flash::Forward(params, ctx);
    if (!status.ok) return absl::InternalError(absl::StrCat("flash forward: ", status.message));
    ATTN_RETURN_IF_CUDA_ERROR(cudaEventRecord(lane.kernel_end, stream));
    ATTN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + layout.out, device + layout.out,
                                              layout.end - layout.out, cudaMemcpyDeviceToHost,
                                              stream));
    return CudaError(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  absl::Status status = run();
  cudaFreeAsync(device, stream);
  if (!status.ok()) return status;

  ForwardResult result;
  result.out = {in.q.dtype, in.q.shape, std::string(host + layout.out, in.q.size_bytes)};
  result.lse = {DType::kFloat32, {num_heads, total_q}, std::string(host + layout.lse, lse_bytes)};
  float kernel_ms = 0;
  cudaEventElapsedTime(&kernel_ms, lane.kernel_start, lane.kernel_end);
  result.execution.device = this->device().name;
  result.execution.kernel = "flash";
  result.execution.compute_us = static_cast<int64_t>(kernel_ms * 1000);
  PublishMemoryUse();
  return result;
}

void CudaWorker::PublishMemoryUse() {
  if (metrics_ == nullptr) return;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    metrics_->SetDeviceMemoryUsed(device().name, static_cast<double>(total_bytes - free_bytes));
  }
}

}  // namespace attnserve::engine
