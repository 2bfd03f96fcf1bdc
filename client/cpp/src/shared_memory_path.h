// Forward and Backward through POSIX shared memory, for a server on this host: the C++ twin of
// client/python/attnserve/shared_memory.py.
//
// The server speaks Triton's system shared memory extension on its gRPC port (the Open
// Inference Protocol's inference.GRPCInferenceService) when started with --allow_shared_memory.
// The client owns shared-memory objects, registers each once, copies a call's inputs into one
// and names them in a ModelInfer of attention_forward / attention_backward; the server reads
// them in place and writes the outputs into the same object, from which they are copied into
// the response's tensors. One region serves one call at a time; concurrent calls each take one
// of a small pool, made on demand and kept for later calls.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "inference/grpc_service.grpc.pb.h"

namespace attnserve::internal {

class CallWorkers;
class ShmRegion;

// Why a call cannot go through shared memory: `status` says why (its code the one a caller
// that insisted on shared memory gets); `permanent` when no later call can either (shared
// memory off on the server, regions it cannot open, no inference service).
struct ShmUnavailable {
  absl::Status status;
  bool permanent = false;
};

// A call's outcome: the answer (or the server's error, as the native API gives it), or why it
// must go another way.
template <typename Response>
struct ShmOutcome {
  std::optional<absl::StatusOr<Response>> answer;
  ShmUnavailable unavailable;  // when `answer` is empty
};

class SharedMemoryPath {
 public:
  // Sets a call's metadata (the token) and the caller's deadline (which the bookkeeping calls,
  // register and unregister, replace with their own).
  using Prepare = std::function<void(grpc::ClientContext& context)>;
  SharedMemoryPath(std::shared_ptr<grpc::Channel> channel, Prepare prepare);
  // Unregisters and unlinks every region (calls must have ended); in a forked child, only
  // unmaps them.
  ~SharedMemoryPath();

  // Registers a first (1 MiB) region unless one is: the server's answer tells whether it maps
  // this client's memory. The answer true, or the refusal of the caller itself
  // (UNAUTHENTICATED, PERMISSION_DENIED) as its error; else unavailable, saying why.
  ShmOutcome<bool> EnsureRegistered();

  // The call through a region. Only for requests whose tensors agree with their shapes and
  // whose q (and a backward's k and v) is 3-dimensional (FitsDataChannel), without a context.
  ShmOutcome<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  ShmOutcome<v1::BackwardResponse> Backward(const v1::BackwardRequest& request);

 private:
  struct Input {
    std::string name;
    const v1::Tensor* tensor;
  };
  struct Output {
    std::string name;
    v1::DType dtype;
    std::vector<int64_t> shape;
    v1::Tensor* into;
  };
  // One ModelInfer of `model`: `inputs` through a region, the offsets inline, `outputs` copied
  // out of the region into their tensors.
  std::optional<ShmUnavailable> Call(const std::string& model, const std::vector<Input>& inputs,
                                     const google::protobuf::RepeatedField<int32_t>& cu_seqlens_q,
                                     const google::protobuf::RepeatedField<int32_t>& cu_seqlens_k,
                                     const std::vector<Output>& outputs,
                                     const v1::AttentionOptions& options,
                                     std::optional<bool> deterministic, absl::Status* error);
  // A registered region of at least `byte_size` bytes for this caller alone: an idle one, else
  // one made (the largest idle one, too small, is dropped).
  absl::StatusOr<ShmRegion*> Acquire(int64_t byte_size, std::optional<ShmUnavailable>* why);
  // Back to the pool; dropped instead when `keep` is false.
  void Release(ShmRegion* region, bool keep);
  // SystemSharedMemoryRegister of the whole region.
  grpc::Status Register(const ShmRegion& region);
  // Unregisters (best effort: a server gone or restarted has nothing mapped left, and one that
  // missed it unregisters after its idle timeout), then unmaps and unlinks.
  void Drop(std::unique_ptr<ShmRegion> region);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
  const Prepare prepare_;
  // A child forked from the owner shares its regions: it must neither write into them nor
  // unregister or unlink them under the owner's feet.
  const pid_t owner_;
  std::mutex mu_;
  std::vector<std::unique_ptr<ShmRegion>> idle_;  // registered, no call uses them
  std::vector<std::unique_ptr<ShmRegion>> busy_;
  // Copies of large tensors (shm_region.h: CopyParallel). Last, so its threads stop first.
  std::unique_ptr<CallWorkers> copiers_;
};

}  // namespace attnserve::internal
