#include "server/engine/request_cost.h"

#include <algorithm>
#include <type_traits>

#include "kernels/kernel_families.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {
namespace {

double ForwardFlops(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                    const TensorView& q, bool causal) {
  double pairs = 0;
  for (size_t b = 1; b < cu_q.size(); ++b) {
    pairs += static_cast<double>(cu_q[b] - cu_q[b - 1]) * (cu_k[b] - cu_k[b - 1]);
  }
  const double flops = 4.0 * pairs * static_cast<double>(q.shape[1]) * q.shape[2];
  return causal ? flops / 2 : flops;
}

double ForwardScores(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                     const TensorView& q, const RequestOptions& options) {
  const bool masked = options.causal || options.window_left || options.window_right;
  double pairs = 0;
  for (size_t b = 1; b < cu_q.size(); ++b) {
    const int64_t len_q = cu_q[b] - cu_q[b - 1];
    const int64_t len_k = cu_k[b] - cu_k[b - 1];
    if (!masked) {
      pairs += static_cast<double>(len_q) * len_k;
      continue;
    }
    // One pass over the rows (at most --max_total_tokens of them) is exact and cheap next to
    // the attention it prices.
    for (int64_t row = 0; row < len_q; ++row) {
      pairs += static_cast<double>(VisibleKeys(options, len_q, len_k, row));
    }
  }
  return pairs * static_cast<double>(q.shape[1]);
}

// What each built device family would allocate as its workspace (`bytes(family)`) for the
// whole request, on whichever of its code paths runs (routing picks one per device); a split
// launch allocates at most that, its largest piece's.
template <typename Bytes>
std::vector<FamilyWorkspace> EachDeviceFamilysWorkspace(Bytes&& bytes) {
  std::vector<FamilyWorkspace> workspaces;
  for (const kernels::KernelFamilyEntry& family : kernels::BuiltKernelFamilies()) {
    if (family.runs_on_device) {
      workspaces.push_back({family.name, static_cast<int64_t>(bytes(family))});
    }
  }
  return workspaces;
}

template <typename Params, typename Inputs>
Params ShapeAndOptionsOf(const Inputs& in) {
  Params params;
  params.shape = ShapeOf(in.q, in.k, in.cu_seqlens_q, in.cu_seqlens_k);
  params.options = ResolveOptions(in.options, params.shape.head_dim);
  return params;
}

std::vector<FamilyWorkspace> Workspaces(const ForwardInputs& in) {
  const auto params = ShapeAndOptionsOf<kernels::ForwardParams>(in);
  return EachDeviceFamilysWorkspace([&](const kernels::KernelFamilyEntry& family) {
    return family.forward_workspace_bytes(params);
  });
}

std::vector<FamilyWorkspace> Workspaces(const BackwardInputs& in) {
  auto params = ShapeAndOptionsOf<kernels::BackwardParams>(in);
  params.deterministic = in.deterministic;
  return EachDeviceFamilysWorkspace([&](const kernels::KernelFamilyEntry& family) {
    return family.backward_workspace_bytes(params, /*code_path=*/{});
  });
}

template <typename Inputs>
RequestProfile Profile(const Inputs& in, Direction direction) {
  RequestProfile profile;
  profile.direction = direction;
  profile.dtype = in.q.dtype;
  profile.head_dim = static_cast<int>(in.q.shape[2]);
  profile.flops = AttentionFlops(in);
  profile.scores = ScoreWork(in);
  profile.device_bytes = DeviceBytes(in);
  profile.workspaces = Workspaces(in);
  profile.dropout = in.options.has_dropout();
  profile.alibi = in.options.has_alibi();
  if constexpr (std::is_same_v<Inputs, BackwardInputs>) profile.deterministic = in.deterministic;
  return profile;
}

}  // namespace

int64_t VisibleKeys(const RequestOptions& options, int64_t len_q, int64_t len_k, int64_t row) {
  const int64_t diagonal = row + len_k - len_q;
  int64_t first = 0;
  int64_t last = len_k - 1;
  if (options.causal) last = std::min(last, diagonal);
  if (options.window_left && *options.window_left >= 0) {
    first = std::max(first, diagonal - *options.window_left);
  }
  if (options.window_right && *options.window_right >= 0) {
    last = std::min(last, diagonal + *options.window_right);
  }
  return std::max<int64_t>(0, last - first + 1);
}

double AttentionFlops(const ForwardInputs& in) {
  return ForwardFlops(in.cu_seqlens_q, in.cu_seqlens_k, in.q, in.options.causal);
}

double AttentionFlops(const BackwardInputs& in) {
  return kBackwardWorkFactor *
         ForwardFlops(in.cu_seqlens_q, in.cu_seqlens_k, in.q, in.options.causal);
}

double ScoreWork(const ForwardInputs& in) {
  return ForwardScores(in.cu_seqlens_q, in.cu_seqlens_k, in.q, in.options);
}

double ScoreWork(const BackwardInputs& in) {
  return kBackwardWorkFactor * ForwardScores(in.cu_seqlens_q, in.cu_seqlens_k, in.q, in.options);
}

int64_t DeviceBytes(const ForwardInputs& in) {
  const int64_t lse = sizeof(float) * in.q.shape[0] * in.q.shape[1];
  return 2 * in.q.size_bytes + in.k.size_bytes + in.v.size_bytes + lse;
}

int64_t DeviceBytes(const BackwardInputs& in) {
  const int64_t inputs = in.dout.size_bytes + in.q.size_bytes + in.k.size_bytes +
                         in.v.size_bytes + in.out.size_bytes + in.lse.size_bytes;
  const int64_t outputs = in.q.size_bytes + in.k.size_bytes + in.v.size_bytes;
  return inputs + outputs + in.lse.size_bytes;  // scratch: one float per query row and head
}

int64_t RequestProfile::WorkspaceBytes(std::string_view family) const {
  for (const FamilyWorkspace& workspace : workspaces) {
    if (workspace.family == family) return workspace.bytes;
  }
  return 0;
}

RequestProfile ProfileOf(const ForwardInputs& in) { return Profile(in, Direction::kForward); }
RequestProfile ProfileOf(const BackwardInputs& in) { return Profile(in, Direction::kBackward); }

}  // namespace attnserve::engine
