// attnload's workload: the pool of pre-built requests it cycles through (so generating
// tensors never limits the load), their FLOP counts, and the --check verification.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/client.h"
#include "tools/attention_problem.h"
#include "tools/load_config.h"

namespace attnserve::load {

// Query-key pairs one sequence computes: sq*sk, or with causal masking (bottom-right aligned,
// query i sees key j iff j <= i + sk - sq) exactly the visible ones.
int64_t VisiblePairs(int64_t seqlen_q, int64_t seqlen_k, bool causal);

// A forward's FLOPs: 4 * head_dim * heads * sum of visible pairs (QK^T and PV, a multiply and
// an add each). A backward does kBackwardFlopFactor times as many.
double ForwardFlops(const std::vector<int32_t>& cu_seqlens_q,
                    const std::vector<int32_t>& cu_seqlens_k, int num_heads, int head_dim,
                    bool causal);
inline constexpr double kBackwardFlopFactor = 2.5;

// Sequence lengths of `count` requests drawn from `shape` (deterministic in `seed`).
std::vector<SequenceLengths> SampleShapes(const ShapeSpec& shape, int count, uint64_t seed);
// At most `count` of a file's requests, evenly spaced so a long file is represented whole.
std::vector<SequenceLengths> SelectRequests(const std::vector<SequenceLengths>& all, int count);

struct WorkloadOptions {
  int heads = 16, heads_k = 16, head_dim = 128;
  v1::DType dtype = v1::DTYPE_BFLOAT16;
  bool causal = false;
  bool forward = true, backward = false;
  // The forward requests keep their contexts (for backward steps on them).
  bool keep_context = false;
  bool references = false;  // compute the local reference answers --check compares with
  uint64_t seed = 1;
};

struct WorkItem {
  std::shared_ptr<const v1::ForwardRequest> forward;    // null unless options.forward
  std::shared_ptr<const v1::BackwardRequest> backward;  // null unless options.backward
  int64_t tokens = 0;                                   // query tokens
  double forward_flops = 0;
  std::optional<tools::ForwardAnswer> forward_answer;
  std::optional<tools::BackwardAnswer> backward_answer;
};

// One item per entry of `shapes`. A backward request differentiates the server's own forward
// answer (one Forward through `client` per item), or the local reference's when the server
// refuses that forward, so a pool builds even against a server that rejects the shapes.
absl::StatusOr<std::vector<WorkItem>> BuildPool(const std::vector<SequenceLengths>& shapes,
                                                const WorkloadOptions& options, Client& client);

// OK when the response matches the item's reference answer within the dtype's tolerance.
absl::Status VerifyForward(const WorkItem& item, const v1::ForwardResponse& response);
absl::Status VerifyBackward(const WorkItem& item, const v1::BackwardResponse& response);

}  // namespace attnserve::load
