// A saved context: what a keep_context Forward leaves on its device for the Backward that
// follows (q, k, v, out, lse, the offsets and the options), so that Backward sends only dout.
// The worker that ran the forward owns where the bytes live (host memory on the CPU device,
// device memory on a GPU: ContextMemory); the context store (context_store.h) owns contexts
// and decides when they go.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/attention_request.h"

namespace attnserve::engine {

enum class ContextTensor { kQ, kK, kV, kOut, kLse, kCuSeqlensQ, kCuSeqlensK };
inline constexpr int kContextTensors = 7;

// The bytes of one context. Freed by its destructor, which may run on any thread (the store's
// sweeper, a request's answer thread).
class ContextMemory {
 public:
  virtual ~ContextMemory() = default;
  // Bytes held, counted against the device's context budget and memory budget.
  virtual int64_t bytes() const = 0;
  // Whether address() is host memory (else: device memory of the worker's device).
  virtual bool on_host() const = 0;
  virtual const char* address(ContextTensor tensor) const = 0;
};

// Everything a backward needs to know about the context besides its bytes.
struct ContextSpec {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> q_shape;  // also out's
  std::vector<int64_t> k_shape;  // also v's
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  RequestOptions options;

  static ContextSpec Of(const ForwardInputs& forward);
  std::vector<int64_t> lse_shape() const { return {q_shape[1], q_shape[0]}; }
};

struct SavedContext {
  std::string device;     // the worker's device name: its backward runs there
  std::string principal;  // who made it (JobControl::principal); only they may use it
  ContextSpec spec;
  std::unique_ptr<ContextMemory> memory;
};

// Host copies of a forward's q, k, v and its result's out and lse (the CPU device's payload,
// and any worker's when its forward ran on the host).
std::unique_ptr<ContextMemory> SaveOnHost(const ForwardInputs& forward,
                                          const ForwardResult& result);

// INVALID_ARGUMENT naming the first field the backward sent that disagrees with the context
// (dtype or shape of q, k, v, out, lse; cu_seqlens_q/k; options); absent tensors, empty offsets
// and default options count as not sent.
absl::Status CheckAgreesWithContext(const BackwardInputs& in, const ContextSpec& spec);

// Fills what the backward left out from the context: offsets, options, and q, k, v, out, lse
// as views of the context's dtype and shapes, pointing at its bytes when they are on the host
// (null data when they are in device memory; the worker reads them there).
void FillFromContext(const SavedContext& context, BackwardInputs& in);
// Then asks the output space for dk's and dv's memory where it has none for them
// (OutputSpace::allocate).
void AllocateContextOutputs(BackwardInputs& in);

// Device bytes a backward on a context needs besides the context itself: dout, dq, dk, dv and
// the float32 scratch per query row and head.
int64_t ContextBackwardDeviceBytes(const BackwardInputs& filled);

}  // namespace attnserve::engine
