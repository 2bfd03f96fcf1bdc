// The engine's request and result types, independent of how the bytes arrived (gRPC unary,
// the data channel). Inputs are views: the transport keeps the bytes alive until the job's
// completion callback has run. Outputs own their bytes as std::string so a transport can move
// them into its response without another copy, unless the transport gave the job host memory
// to write them to (OutputSpace): then they are there and the result carries no bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "server/engine/kernel_routing.h"

namespace attnserve::engine {

using kernels::DType;

class SequenceGroups;  // sequence_groups.h

// An ABSENT tensor (a backward on a saved context may leave q, k, v, out and lse out) has an
// empty `shape` and null `data`; a present one always has non-null `data`, even when empty.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const char* data = nullptr;
  size_t size_bytes = 0;
  // >= 0: `data` is memory of the CUDA device of this ordinal (a co-located client's CUDA
  // shared memory), which only a GPU kernel family on that device reads; -1: host memory.
  int device = -1;

  bool absent() const { return shape.empty() && data == nullptr; }
};

// `data` is empty when the tensor's bytes were written to the job's OutputSpace destination.
struct OwnedTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;

  // What dtype and shape take, wherever the bytes are.
  size_t size_bytes() const {
    size_t bytes = kernels::DTypeSize(dtype);
    for (int64_t d : shape) bytes *= static_cast<size_t>(d);
    return bytes;
  }
};

// Host memory a transport gives a job for its outputs (forward: out, lse; backward: dq, dk,
// dv), one destination per output (null: none for that one), each as large as that output, so
// results land where the transport sends them from instead of in a second host copy. A
// destination may be the very bytes of the input of the same shape (out: q; dq: dout; dk: k;
// dv: v), which the transport no longer needs: a worker writes such an "overlay" only where it
// has finished reading that input first, and otherwise ignores the destination and returns
// owned bytes, as it does for every output of a batched launch. The memory must stay valid
// until the job's completion callback has run.
struct OutputSpace {
  std::vector<char*> destinations;
  // For outputs whose size the transport cannot know (dk and dv of a backward on a saved
  // context, shaped like the context's k): the engine asks for their memory once it knows,
  // during Enqueue, and sets the destination to what it returns (null: none given). Empty:
  // the engine does not ask.
  std::function<char*(size_t output, size_t bytes)> allocate;
  // >= 0: the destinations are memory of the CUDA device of this ordinal, as TensorView::device.
  int device = -1;

  char* at(size_t output) const {
    return output < destinations.size() ? destinations[output] : nullptr;
  }
};

// As on the wire: softmax_scale 0 means 1/sqrt(head_dim); absent windows are unbounded.
struct RequestOptions {
  float softmax_scale = 0.0f;
  bool causal = false;
  std::optional<int32_t> window_left;
  std::optional<int32_t> window_right;
  float softcap = 0.0f;
  float dropout_p = 0.0f;  // 0 = off
  // The request's dropout seed (ForwardRequest / BackwardRequest.dropout_seed): the engine
  // replaces a forward's 0 by one it picks, before the forward runs or keeps a context.
  uint64_t dropout_seed = 0;
  // ALiBi slopes as sent, copied (batch x num_heads floats at most): float32 [num_heads] or
  // [batch, num_heads] once validated. Absent = off. Owned, so a kept context keeps them.
  std::optional<OwnedTensor> alibi_slopes;

  bool has_dropout() const { return dropout_p > 0.0f; }
  bool has_alibi() const { return alibi_slopes.has_value(); }
};

// Whether two requests ask for the same attention, dropout_seed aside (callers compare it
// where it matters: a context's backward).
inline bool SameOptionsButSeed(const RequestOptions& a, const RequestOptions& b) {
  auto same_slopes = [](const std::optional<OwnedTensor>& x, const std::optional<OwnedTensor>& y) {
    if (x.has_value() != y.has_value()) return false;
    return !x || (x->dtype == y->dtype && x->shape == y->shape && x->data == y->data);
  };
  return a.softmax_scale == b.softmax_scale && a.causal == b.causal &&
         a.window_left == b.window_left && a.window_right == b.window_right &&
         a.softcap == b.softcap && a.dropout_p == b.dropout_p &&
         same_slopes(a.alibi_slopes, b.alibi_slopes);
}

struct ForwardInputs {
  TensorView q, k, v;
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  RequestOptions options;
  // Keep q, k, v, out, lse, the offsets and options for a later Backward (saved_context.h).
  bool keep_context = false;
  OutputSpace output_space;  // out, lse
  // Set when the inputs are still arriving, group by group: the worker waits for each group
  // before it reads its rows (sequence_groups.h). Such a job runs alone.
  std::shared_ptr<SequenceGroups> groups;
  // The family and code path placement chose on the job's device (kernel_routing.h): the
  // worker runs it and routes nothing again.
  Route route;
};

struct BackwardInputs {
  TensorView dout, q, k, v, out, lse;
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  RequestOptions options;
  bool deterministic = false;
  // Non-empty: q, k, v, out, lse, offsets and options come from this saved context; those sent
  // anyway must agree with it. Absent tensors, empty offsets and default options count as not
  // sent.
  std::string context_id;
  bool keep_context = false;  // keep the context after this backward (default: release it)
  OutputSpace output_space;   // dq, dk, dv
  // As a forward's: the inputs (dout, and q, k, v, out by rows and lse whole with the first
  // group when they travel) still arrive group by group. Such a job runs alone.
  std::shared_ptr<SequenceGroups> groups;
  Route route;  // as a forward's
};

// Where and how a request ran (the wire's Execution message).
struct ExecutionReport {
  std::string device;
  std::string kernel;
  int64_t queue_us = 0;
  int64_t compute_us = 0;
  int32_t batched_requests = 1;
  std::string code_path;  // family and its code path, e.g. "flash/sm90", "reference/cpu"
};

struct ForwardResult {
  OwnedTensor out;  // [total_q, num_heads, head_dim], dtype of q
  OwnedTensor lse;  // [num_heads, total_q] float32
  ExecutionReport execution;
  uint64_t dropout_seed = 0;  // the seed dropout used (the engine sets it); 0 without dropout
  // The kept context's id when keep_context was asked for and it fit the context budget;
  // empty otherwise (the client then sends its backward in full).
  std::string context_id;
};

struct BackwardResult {
  OwnedTensor dq, dk, dv;
  ExecutionReport execution;
};

}  // namespace attnserve::engine
