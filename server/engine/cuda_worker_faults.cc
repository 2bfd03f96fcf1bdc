// CudaWorker's side of device faults (device_health.h): injecting a real one, and resetting the
// device's context so it can serve again.
#include "absl/strings/str_cat.h"
#include "kernels/fault/trap_kernel.h"
#include "server/engine/cuda_ipc.h"
#include "server/engine/cuda_worker.h"
#include "server/engine/device_fault.h"
#ifdef ATTN_HAVE_CUBLAS
#include "kernels/cublas/gemm.h"
#endif

namespace attnserve::engine {
namespace {

#define ATTN_RETURN_IF_CUDA_ERROR(call)                                   \
  do {                                                                    \
    if (absl::Status _s = CudaStatus((call), #call); !_s.ok()) return _s; \
  } while (0)

// Whether the reset device works: memory can be allocated, written and read back.
absl::Status ProbeDevice() {
  constexpr size_t kProbeBytes = 1 << 20;
  void* memory = nullptr;
  ATTN_RETURN_IF_CUDA_ERROR(cudaMalloc(&memory, kProbeBytes));
  unsigned char first = 0;
  absl::Status status = CudaStatus(cudaMemset(memory, 0xA5, kProbeBytes), "cudaMemset");
  if (status.ok()) {
    status = CudaStatus(cudaMemcpy(&first, memory, 1, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  cudaFree(memory);
  if (status.ok() && first != 0xA5) status = absl::InternalError("probe read back wrong bytes");
  return status;
}

}  // namespace

absl::Status CudaWorker::InjectFault(int lane) {
  // Its own stream: a sticky error spoils the whole context, whichever stream saw it.
  cudaSetDevice(lanes_[lane]->ordinal());
  cudaStream_t stream = nullptr;
  ATTN_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::Status status =
      CudaStatus(kernels::fault::LaunchTrapKernel(stream), "trap kernel launch");
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  return status;
}

absl::Status CudaWorker::ResetDevice() {
  const int ordinal = device().ordinal;
  // Streams, events and pinned staging of the lanes belong to the context the reset destroys
  // (the queue worker calls this with every lane idle); saved contexts on the device were
  // dropped when it faulted.
  for (std::unique_ptr<CudaLane>& lane : lanes_) lane.reset();
#ifdef ATTN_HAVE_CUBLAS
  kernels::cublas::ForgetHandles(ordinal);
#endif
  ATTN_RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal));
  NoteDeviceReset(ordinal);  // clients' CUDA shared memory opened here goes with the context
  ATTN_RETURN_IF_CUDA_ERROR(cudaDeviceReset());
  ATTN_RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal));  // a fresh primary context
  if (absl::Status probe = ProbeDevice(); !probe.ok()) return probe;
  // The fresh context's pool keeps freed memory, as CudaWorker::Create set the first one's.
  cudaMemPool_t pool;
  ATTN_RETURN_IF_CUDA_ERROR(cudaDeviceGetDefaultMemPool(&pool, ordinal));
  uint64_t keep_everything = UINT64_MAX;
  ATTN_RETURN_IF_CUDA_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  for (std::unique_ptr<CudaLane>& lane : lanes_) {
    absl::StatusOr<std::unique_ptr<CudaLane>> made =
        CudaLane::Create(ordinal, stage_threads_per_lane_);
    if (!made.ok()) return made.status();
    lane = *std::move(made);
  }
  return absl::OkStatus();
}

}  // namespace attnserve::engine
