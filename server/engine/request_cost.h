// What a request costs: attention FLOPs by the convention every benchmark of ours uses
// (DESIGN.md: 4·Σ sq·sk·d·heads forward, halved when causal, 2.5× that backward; feeds
// attnserve_flops_total, from which dashboards derive TFLOP/s), the attention scores its
// kernels compute (what dominates at small head_dim, where FLOPs say almost nothing: one
// 32,768-token sequence at head_dim 1 is 4 GFLOP but 10⁹ scores, ~19 s of the CPU device), and
// the device memory it occupies while it runs (for admission control).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine/attention_request.h"
#include "server/engine/kernel_routing.h"

namespace attnserve::engine {

// A backward does this many times the work of its forward (DESIGN.md's convention).
inline constexpr double kBackwardWorkFactor = 2.5;

double AttentionFlops(const ForwardInputs& in);
double AttentionFlops(const BackwardInputs& in);

// Keys query row `row` of a (len_q, len_k) sequence sees: j ≤ row + len_k − len_q when causal,
// within [diagonal − window_left, diagonal + window_right] with a window (DESIGN.md).
int64_t VisibleKeys(const RequestOptions& options, int64_t len_q, int64_t len_k, int64_t row);

// Σ over sequences and query heads of the keys each query row sees (bottom-right aligned
// causal mask and sliding window applied, as the kernels skip keys no row sees), times
// kBackwardWorkFactor for a backward. Each score costs a scale, a max, an exp and a sum
// whatever head_dim is.
double ScoreWork(const ForwardInputs& in);
double ScoreWork(const BackwardInputs& in);

// Bytes of device memory a request occupies while it runs: its inputs, its outputs and the
// float32 scratch a backward keeps per query row and head. The kernel family's own workspace
// comes on top (RequestProfile::WorkspaceBytes).
int64_t DeviceBytes(const ForwardInputs& in);
int64_t DeviceBytes(const BackwardInputs& in);

// The workspace a family that runs on a device allocates beside the request's tensors (e.g.
// the flash backward's float32 dQ accumulator, twice the bytes of a 16-bit q; cuBLAS's
// scratch), as its *_workspace_bytes entry point says for the whole request on any of its code
// paths (flash's Hopper path at head dims 200-256 needs no accumulator; it is counted anyway).
struct FamilyWorkspace {
  std::string family;
  int64_t bytes = 0;
};

// What placement and admission need to know about a request.
struct RequestProfile {
  Direction direction = Direction::kForward;
  DType dtype = DType::kFloat32;
  int head_dim = 0;
  double flops = 0;          // AttentionFlops
  double scores = 0;         // ScoreWork
  int64_t device_bytes = 0;  // DeviceBytes: what it holds on a GPU while it runs
  bool dropout = false;      // options only some kernel families serve (kernel_routing.h)
  bool alibi = false;
  bool deterministic = false;  // a backward's (some code paths are atomic-only)
  // Per built device family with a workspace (kernels/kernel_families.h): reserved in a GPU's
  // memory budget beside device_bytes, since the launch allocates it with the tensors.
  std::vector<FamilyWorkspace> workspaces;

  // The workspace `family` allocates for this request; 0 for families without one.
  int64_t WorkspaceBytes(std::string_view family) const;
};

RequestProfile ProfileOf(const ForwardInputs& in);
RequestProfile ProfileOf(const BackwardInputs& in);

}  // namespace attnserve::engine
