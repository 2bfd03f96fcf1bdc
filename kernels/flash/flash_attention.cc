#include "kernels/flash/flash_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "kernels/flash/arch.h"
#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_launch.h"
#include "kernels/flash/bwd_sm90_dq_tiles.h"
#include "kernels/flash/fwd_args.h"
#include "kernels/architecture_limits.h"
#include "kernels/gpu_device.h"
#include "kernels/gpu_extras.h"
#include "kernels/gpu_launch_common.h"
#include "kernels/flash/fwd_launch.h"
#include "kernels/flash/kernel_tables.h"
#include "kernels/flash/tile_config.h"
#include "kernels/flash_sm90_rule.h"

namespace attnserve::kernels::flash {
namespace {

KernelStatus Error(const std::string& message) { return KernelStatus::Error("flash: " + message); }

KernelStatus CudaError(const char* what, cudaError_t err) {
  return Error(std::string(what) + " failed: " + cudaGetErrorString(err));
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

KernelStatus Validate(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  if (s.dtype == DType::kFloat32) return Error("fp32 is not supported");
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) return Error("unknown dtype");
  if (s.head_dim < 1 || s.head_dim % kHeadDimGranule != 0 || s.head_dim > kMaxHeadDim) {
    return Error("head_dim " + std::to_string(s.head_dim) + " is not supported (multiples of " +
                 std::to_string(kHeadDimGranule) + " up to " + std::to_string(kMaxHeadDim) + ")");
  }
  if (std::string problem = SequencesProblem(p); !problem.empty()) return Error(problem);
  // A K/V tile spans up to 128 rows of q/k row strides in 32-bit element offsets.
  const int64_t max_row_stride = int64_t{std::numeric_limits<int32_t>::max()} / 256;
  if (int64_t{s.num_heads} * s.head_dim > max_row_stride) {
    return Error("num_heads * head_dim is too large");
  }
  if (!Aligned16(p.q) || !Aligned16(p.k) || !Aligned16(p.v) || !Aligned16(p.out)) {
    return Error("q, k, v and out must be 16-byte aligned");
  }
  if (std::string problem = OptionsProblem(p.options); !problem.empty()) return Error(problem);
  return KernelStatus::Ok();
}

// The current device (kernels/gpu_device.h).
KernelStatus CurrentDevice(GpuDevice* device) {
  const char* failed_call = nullptr;
  const cudaError_t err = QueryCurrentGpu(device, &failed_call);
  return err == cudaSuccess ? KernelStatus::Ok() : CudaError(failed_call, err);
}

std::string CcName(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// Which code path runs: the effective compute capability is ctx.compute_capability (to run an
// older architecture's path on a newer GPU) or the device's own. >= 8.0: the sm80 kernels;
// 7.5-7.9: the Turing kernels (fp16, head_dim <= 64); below 7.5, or above what the device is
// (a newer path cannot run on an older GPU): an error.
struct Target {
  int compute_capability;  // effective: the path's, not necessarily the device's
  bool turing;
  GpuDevice device;
  // Shared memory a block may use: the device's opt-in limit, or less when an older
  // architecture's path runs (that GPU's own limit), so the kernels choose as they would there.
  int smem_limit;
};

KernelStatus SelectTarget(const ExecutionContext& ctx, DType dtype, int head_dim, bool extras,
                          Target* target) {
  if (ctx.compute_capability < 0) {
    return Error("compute_capability must be >= 0 (0 = the device's own)");
  }
  KernelStatus status = CurrentDevice(&target->device);
  if (!status.ok) return status;
  const int device_cc = target->device.compute_capability;
  const int cc = ctx.compute_capability == 0 ? device_cc : ctx.compute_capability;
  if (cc > device_cc) {
    return Error("compute_capability " + CcName(cc) + " is above device " +
                 std::to_string(target->device.device) + "'s " + CcName(device_cc) +
                 ": a newer architecture's path cannot run on it");
  }
  if (cc < Sm75::kComputeCapability) {
    return Error("needs compute capability >= 7.5, got " + CcName(cc) +
                 (ctx.compute_capability == 0
                      ? " (device " + std::to_string(target->device.device) + ")"
                      : std::string()));
  }
  target->compute_capability = cc;
  target->turing = cc < Sm80::kComputeCapability;
  target->smem_limit = target->device.smem_optin;
  if (const int arch_limit = SharedMemoryPerBlockOf(cc);
      cc != device_cc && arch_limit > 0 && arch_limit < target->smem_limit) {
    target->smem_limit = arch_limit;
  }
  if (target->turing && (dtype != DType::kFloat16 || head_dim > Sm75::kMaxHeadDim)) {
    return Error("flash on sm75 supports fp16 head_dim <= " + std::to_string(Sm75::kMaxHeadDim) +
                 "; route to fallback (got " + (dtype == DType::kFloat16 ? "fp16" : "bf16") +
                 " head_dim " + std::to_string(head_dim) + ")");
  }
  if (target->turing && extras) {
    return Error("flash on sm75 does not support dropout or ALiBi (only the sm80 path, compute "
                 "capability >= 8.0, runs them); route to cublas or reference");
  }
  return KernelStatus::Ok();
}

// The Hopper rule's inputs as the dispatcher sees them: the target's capabilities and limit.
Sm90Candidate Sm90CandidateOf(const Target& target, const ExecutionContext& ctx, bool backward,
                              bool built, int smem, bool extras) {
  Sm90Candidate c;
  c.backward = backward;
  c.compute_capability = target.compute_capability;
  c.device_compute_capability = target.device.compute_capability;
  c.kernel_built = built;
  c.kernel_shared_memory = smem;
  c.shared_memory_limit = target.smem_limit;
  c.extras = extras;
  c.disabled_paths = ctx.disabled_paths;
  return c;
}

KernelStatus CheckSmem(const Target& target, int smem, const std::string& what) {
  if (smem > target.smem_limit) {
    return Error(what + " needs " + std::to_string(smem) +
                 " bytes of shared memory per block, device " +
                 std::to_string(target.device.device) + " allows " +
                 std::to_string(target.smem_limit));
  }
  return KernelStatus::Ok();
}

KernelStatus NotBuilt(const Target& target, const char* what, int head_dim) {
  return Error(std::string(target.turing ? "sm75 " : "") + what + "head_dim " +
               std::to_string(head_dim) + " is not built into this binary (see ATTN_HEAD_DIMS)");
}

// Workspace parts: D = rowsum(dO * O) (float32 [num_heads, total_q]), then in non-deterministic
// mode the float32 dQ accumulator ([total_q, num_heads, head_dim]).
size_t BackwardDsumBytes(const AttentionShape& s) {
  if (s.total_q <= 0 || s.num_heads <= 0) return 0;
  return AlignWorkspace(static_cast<size_t>(s.total_q) * static_cast<size_t>(s.num_heads) * 4);
}

size_t BackwardDqAccumBytes(const AttentionShape& s) {
  if (s.total_q <= 0 || s.num_heads <= 0 || s.head_dim <= 0) return 0;
  size_t floats = static_cast<size_t>(s.total_q) * static_cast<size_t>(s.num_heads) *
                  static_cast<size_t>(s.head_dim);
  // The Hopper kernels at 64 / 128 / 192 lay it out by tile (bwd_sm90_dq_tiles.h): room for 64
  // rows more per sequence, at the instantiated head dim (whichever path then runs).
  if (s.batch > 0 && s.head_dim <= 192) {
    const int padded_head_dim = s.head_dim <= 64 ? 64 : s.head_dim <= 128 ? 128 : 192;
    floats = std::max(floats, static_cast<size_t>(TileDqWorkspaceFloats(
                                  s.total_q, s.batch, s.num_heads, padded_head_dim)));
  }
  return AlignWorkspace(floats * 4);
}

}  // namespace

KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx) {
  KernelStatus status = Validate(params);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  const bool extras = HasExtras(params.options);
  Target target;
  status = SelectTarget(ctx, s.dtype, s.head_dim, extras, &target);
  if (!status.ok) return status;
  LaunchFn launch = nullptr;
  int kernel_head_dim = 0;
  int smem = 0;
  if (target.turing) {
    const TuringKernelEntry* kernel = FindTuringKernel(s.head_dim);
    if (kernel == nullptr) return NotBuilt(target, "", s.head_dim);
    launch = kernel->forward;
    kernel_head_dim = kernel->head_dim;
    smem = ForwardSmemBytes<Sm75>(kernel_head_dim);
  } else {
    const KernelEntry* kernel = FindKernel(s.head_dim);
    if (kernel == nullptr) return NotBuilt(target, "", s.head_dim);
    launch = s.dtype == DType::kFloat16 ? kernel->fp16 : kernel->bf16;
    kernel_head_dim = kernel->head_dim;
    smem = ForwardSmemBytes<Sm80>(kernel_head_dim);
    // Hopper: the wgmma kernel where the rule the family's plan applies says so
    // (kernels/flash_sm90_rule.h); otherwise the sm80 kernel.
    const KernelEntry* sm90 = FindSm90Kernel(kernel_head_dim);
    if (RunsSm90(Sm90CandidateOf(target, ctx, /*backward=*/false, sm90 != nullptr,
                                 Sm90ForwardSmemBytes(kernel_head_dim), extras))) {
      launch = s.dtype == DType::kFloat16 ? sm90->fp16 : sm90->bf16;
      smem = Sm90ForwardSmemBytes(kernel_head_dim);
    }
  }
  if (s.total_q == 0) return KernelStatus::Ok();
  if (s.batch == 0) return Error("total_q > 0 needs batch > 0");
  if (s.max_seqlen_q == 0) return Error("max_seqlen_q must be set when total_q > 0");
  status = CheckSmem(target, smem, "head_dim " + std::to_string(kernel_head_dim));
  if (!status.ok) return status;

  const FwdKernelArgs args = MakeGpuAttentionArgs(params);
  const FwdGrid grid{s.batch, s.max_seqlen_q, s.max_seqlen_k, target.device.multiprocessors,
                     s.total_k};
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  if (!extras) return launch(args, grid, stream);
  const ExtrasKernelEntry* kernel = FindExact(kExtrasKernels, kernel_head_dim);
  if (kernel == nullptr) return NotBuilt(target, "dropout/ALiBi ", s.head_dim);
  DeviceAlibiSlopes slopes;
  if (const std::string failed = slopes.Init(params.options, s, stream); !failed.empty()) {
    return Error(failed);
  }
  FwdKernelArgsX xargs;
  static_cast<FwdKernelArgs&>(xargs) = args;
  xargs.x = MakeExtrasArgs(params.options, args.lse_scale, slopes);
  return (s.dtype == DType::kFloat16 ? kernel->fp16 : kernel->bf16)(xargs, grid, stream);
}

namespace {

// Whether the backward adds dQ into the float32 workspace on `code_path` (empty: any path):
// the atomic mode, except on the Hopper path at the head dims where dQ is a kernel of its own.
bool UsesDqAccumulator(const BackwardParams& params, std::string_view code_path) {
  if (params.deterministic) return false;
  if (code_path != Sm90::kName) return true;
  const BackwardKernelEntry* kernel = FindBackwardKernel(params.shape.head_dim);
  return kernel == nullptr || !Sm90BackwardSeparateDq(kernel->head_dim);
}

}  // namespace

size_t BackwardWorkspaceBytes(const BackwardParams& params, std::string_view code_path) {
  return BackwardDsumBytes(params.shape) +
         (UsesDqAccumulator(params, code_path) ? BackwardDqAccumBytes(params.shape) : 0);
}

KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx) {
  const ForwardParams forward = AsForward(params);
  KernelStatus status = Validate(forward);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  const bool extras = HasExtras(params.options);
  if (s.head_dim > kMaxBackwardHeadDim) {
    return Error("backward supports head_dim up to " + std::to_string(kMaxBackwardHeadDim) +
                 ", got " + std::to_string(s.head_dim));
  }
  Target target;
  status = SelectTarget(ctx, s.dtype, s.head_dim, extras, &target);
  if (!status.ok) return status;
  BackwardLaunchFn launch = nullptr;
  int smem = 0;
  int kernel_head_dim = 0;
  bool sm90_path = false;
  if (target.turing) {
    const TuringKernelEntry* kernel = FindTuringKernel(s.head_dim);
    if (kernel == nullptr) return NotBuilt(target, "backward for ", s.head_dim);
    launch = kernel->backward;
    kernel_head_dim = kernel->head_dim;
    smem = BackwardSmemBytes<Sm75>(kernel_head_dim);
  } else {
    const BackwardKernelEntry* kernel = FindBackwardKernel(s.head_dim);
    if (kernel == nullptr) return NotBuilt(target, "backward for ", s.head_dim);
    launch = s.dtype == DType::kFloat16 ? kernel->fp16 : kernel->bf16;
    kernel_head_dim = kernel->head_dim;
    smem = BackwardSmemBytes<Sm80>(kernel_head_dim);
    // Hopper: the wgmma kernels where the plan's rule says so, in both modes.
    const BackwardKernelEntry* sm90 = FindSm90BackwardKernel(kernel_head_dim);
    if (RunsSm90(Sm90CandidateOf(target, ctx, /*backward=*/true, sm90 != nullptr,
                                 Sm90BackwardMaxSmemBytes(kernel_head_dim), extras))) {
      launch = s.dtype == DType::kFloat16 ? sm90->fp16 : sm90->bf16;
      smem = Sm90BackwardMaxSmemBytes(kernel_head_dim);
      sm90_path = true;
    }
  }
  if (s.total_q > 0 && (params.dout == nullptr || params.dq == nullptr)) {
    return Error("dout and dq must be set");
  }
  if (s.total_k > 0 && (params.dk == nullptr || params.dv == nullptr)) {
    return Error("dk and dv must be set");
  }
  if (!Aligned16(params.dout) || !Aligned16(params.dq) || !Aligned16(params.dk) ||
      !Aligned16(params.dv)) {
    return Error("dout, dq, dk and dv must be 16-byte aligned");
  }
  if (s.total_q == 0 && s.total_k == 0) return KernelStatus::Ok();
  if (s.batch == 0) return Error("total_q or total_k > 0 needs batch > 0");
  if ((s.total_q > 0 && s.max_seqlen_q == 0) || (s.total_k > 0 && s.max_seqlen_k == 0)) {
    return Error("max_seqlen_q/_k must be set when total_q/_k > 0");
  }
  // The path this launch runs decides the workspace (a caller that sized it for any path gave
  // at least as much).
  const std::string_view code_path =
      sm90_path ? Sm90::kName : target.turing ? Sm75::kName : Sm80::kName;
  const size_t workspace = BackwardWorkspaceBytes(params, code_path);
  if (ctx.workspace_bytes < workspace || (workspace > 0 && ctx.workspace == nullptr)) {
    return Error("backward needs a workspace of " + std::to_string(workspace) +
                 " bytes (BackwardWorkspaceBytes), got " + std::to_string(ctx.workspace_bytes));
  }
  if (!Aligned16(ctx.workspace)) return Error("workspace must be 16-byte aligned");
  status = CheckSmem(target, smem, "backward at head_dim " + std::to_string(kernel_head_dim));
  if (!status.ok) return status;

  constexpr float kLog2e = 1.4426950408889634f;
  BwdKernelArgs args{};
  args.fwd = MakeGpuAttentionArgs(forward);
  args.dout = params.dout;
  args.dq = params.dq;
  args.dk = params.dk;
  args.dv = params.dv;
  args.dsum = static_cast<float*>(ctx.workspace);
  args.dq_accum = !UsesDqAccumulator(params, code_path) || s.total_q == 0
                      ? nullptr
                      : reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) +
                                                 BackwardDsumBytes(s));
  args.lse_log2_scale = kLog2e;
  args.grad_scale = params.options.softmax_scale;
  const BwdGrid grid{s.batch, s.max_seqlen_q, s.max_seqlen_k, target.smem_limit,
                     target.device.multiprocessors};
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  if (!extras) return launch(args, grid, stream);
  const ExtrasBackwardKernelEntry* kernel = FindExact(kExtrasBackwardKernels, kernel_head_dim);
  if (kernel == nullptr) return NotBuilt(target, "dropout/ALiBi backward for ", s.head_dim);
  DeviceAlibiSlopes slopes;
  if (const std::string failed = slopes.Init(params.options, s, stream); !failed.empty()) {
    return Error(failed);
  }
  BwdKernelArgsX xargs;
  static_cast<BwdKernelArgs&>(xargs) = args;
  xargs.x = MakeExtrasArgs(params.options, args.fwd.lse_scale, slopes);
  return (s.dtype == DType::kFloat16 ? kernel->fp16 : kernel->bf16)(xargs, grid, stream);
}

}  // namespace attnserve::kernels::flash
