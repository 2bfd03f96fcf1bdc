#include "kernels/fallback/fallback_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/fallback/kernel_args.h"
#include "kernels/gpu_device.h"
#include "kernels/gpu_extras.h"
#include "kernels/gpu_launch_common.h"

namespace attnserve::kernels::fallback {

const char* PathName(Path path) {
  switch (path) {
    case Path::kSimt: return "fp32 SIMT";
    case Path::kWmma: return "wmma (sm70)";
    case Path::kMma1688: return "mma.sync m16n8k8 (sm75)";
    case Path::kMma16816: return "mma.sync m16n8k16 (sm80)";
  }
  return "unknown";
}

namespace {

using ForwardRun = KernelStatus (*)(const FwdArgs&, const ExtrasArgs&, Path, const LaunchShape&,
                                    void*);
using BackwardRun = KernelStatus (*)(const BwdArgs&, const ExtrasArgs&, Path, const LaunchShape&,
                                     void*);

struct BucketEntry {
  int head_dim;
  ForwardRun forward[2][3];  // by extras (dropout or ALiBi on), then DType: fp16, bf16, fp32
  BackwardRun backward[2][3];
};

template <int kHeadDim, bool kExtras>
constexpr BucketEntry MakeEntryPart(BucketEntry entry) {
  entry.forward[kExtras][0] = &RunForward<DType::kFloat16, kHeadDim, kExtras>;
  entry.forward[kExtras][1] = &RunForward<DType::kBFloat16, kHeadDim, kExtras>;
  entry.forward[kExtras][2] = &RunForward<DType::kFloat32, kHeadDim, kExtras>;
  entry.backward[kExtras][0] = &RunBackward<DType::kFloat16, kHeadDim, kExtras>;
  entry.backward[kExtras][1] = &RunBackward<DType::kBFloat16, kHeadDim, kExtras>;
  entry.backward[kExtras][2] = &RunBackward<DType::kFloat32, kHeadDim, kExtras>;
  return entry;
}

template <int kHeadDim>
constexpr BucketEntry MakeEntry() {
  BucketEntry entry{};
  entry.head_dim = kHeadDim;
  return MakeEntryPart<kHeadDim, true>(MakeEntryPart<kHeadDim, false>(entry));
}

// The head-dim buckets this build holds (ATTN_FALLBACK_HEAD_DIMS), ascending; a head dim runs on
// the smallest bucket that holds it, zero-padded.
constexpr BucketEntry kBuckets[] = {
#include "fallback_buckets.inc"
};

constexpr int kMinComputeCapability = 70;

KernelStatus Error(const std::string& message) {
  return KernelStatus::Error("fallback: " + message);
}

KernelStatus CudaError(const char* what, cudaError_t err) {
  return Error(std::string(what) + " failed: " + cudaGetErrorString(err));
}

const BucketEntry* FindBucket(int head_dim) {
  for (const BucketEntry& entry : kBuckets) {
    if (entry.head_dim >= head_dim) return &entry;
  }
  return nullptr;
}

int DTypeIndex(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 0;
    case DType::kBFloat16: return 1;
    case DType::kFloat32: return 2;
  }
  return -1;
}

bool AlignedTo(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

KernelStatus Validate(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  if (DTypeIndex(s.dtype) < 0) return Error("unknown dtype");
  const int max_head_dim = std::end(kBuckets)[-1].head_dim;
  if (s.head_dim < 1 || s.head_dim > max_head_dim) {
    return Error("head_dim " + std::to_string(s.head_dim) + " is not supported (1 to " +
                 std::to_string(max_head_dim) + " in this build, see ATTN_FALLBACK_HEAD_DIMS)");
  }
  if (std::string problem = SequencesProblem(p); !problem.empty()) return Error(problem);
  const size_t elem = static_cast<size_t>(DTypeSize(s.dtype));
  if (!AlignedTo(p.q, elem) || !AlignedTo(p.k, elem) || !AlignedTo(p.v, elem) ||
      !AlignedTo(p.out, elem) || !AlignedTo(p.lse, 4)) {
    return Error("q, k, v, out and lse must be aligned to their element size");
  }
  if (std::string problem = OptionsProblem(p.options); !problem.empty()) return Error(problem);
  return KernelStatus::Ok();
}

struct DeviceInfo {
  int compute_capability;  // of the code path to run
  Path path;
  int smem_limit;
};

// The code path: ctx.compute_capability (0 = the device's own), which may not be newer than
// the device.
KernelStatus SelectPath(DType dtype, const ExecutionContext& ctx, DeviceInfo* info) {
  GpuDevice gpu;
  const char* failed_call = nullptr;
  if (const cudaError_t err = QueryCurrentGpu(&gpu, &failed_call); err != cudaSuccess) {
    return CudaError(failed_call, err);
  }
  const int device = gpu.device;
  const int device_cc = gpu.compute_capability;
  const int cc = ctx.compute_capability == 0 ? device_cc : ctx.compute_capability;
  if (cc < kMinComputeCapability) {
    return Error("needs compute capability >= 7.0, " +
                 (ctx.compute_capability == 0
                      ? "device " + std::to_string(device) + " has " +
                            std::to_string(device_cc / 10) + "." + std::to_string(device_cc % 10)
                      : "requested " + std::to_string(cc)));
  }
  if (cc > device_cc) {
    return Error("the code path of compute capability " + std::to_string(cc) +
                 " cannot run on device " + std::to_string(device) + " (compute capability " +
                 std::to_string(device_cc) + ")");
  }
  Path path = Path::kSimt;
  if (dtype == DType::kFloat16) {
    path = cc >= 80 ? Path::kMma16816 : cc >= 75 ? Path::kMma1688 : Path::kWmma;
  } else if (dtype == DType::kBFloat16) {
    path = cc >= 80 ? Path::kMma16816 : Path::kSimt;
  }
  *info = {cc, path, gpu.smem_optin};
  return KernelStatus::Ok();
}

FwdArgs MakeForwardArgs(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  FwdArgs args{};
  static_cast<GpuAttentionArgs&>(args) = MakeGpuAttentionArgs(p);
  args.total_k = s.total_k;
  args.vector_io = (s.head_dim * DTypeSize(s.dtype)) % 16 == 0 && AlignedTo(p.q, 16) &&
                   AlignedTo(p.k, 16) && AlignedTo(p.v, 16) && AlignedTo(p.out, 16);
  return args;
}

}  // namespace

KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx) {
  KernelStatus status = Validate(params);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  if (s.total_q == 0) return KernelStatus::Ok();
  if (s.batch == 0) return Error("total_q > 0 needs batch > 0");
  if (s.max_seqlen_q == 0) return Error("max_seqlen_q must be set when total_q > 0");
  DeviceInfo info{};
  status = SelectPath(s.dtype, ctx, &info);
  if (!status.ok) return status;
  const BucketEntry* bucket = FindBucket(s.head_dim);
  const LaunchShape shape{s.batch, s.max_seqlen_q, s.max_seqlen_k, info.smem_limit};
  const bool extras = HasExtras(params.options);
  DeviceAlibiSlopes slopes;  // freed in stream order after the launch
  if (std::string problem =
          slopes.Init(params.options, s, static_cast<cudaStream_t>(ctx.stream));
      !problem.empty()) {
    return Error(problem);
  }
  const FwdArgs args = MakeForwardArgs(params);
  return bucket->forward[extras][DTypeIndex(s.dtype)](
      args, MakeExtrasArgs(params.options, args.lse_scale, slopes), info.path, shape, ctx.stream);
}

size_t BackwardWorkspaceBytes(const BackwardParams& params) {
  const AttentionShape& s = params.shape;
  if (s.total_q <= 0 || s.num_heads <= 0) return 0;
  const size_t bytes = static_cast<size_t>(s.total_q) * static_cast<size_t>(s.num_heads) * 4;
  return AlignWorkspace(bytes);
}

KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx) {
  const ForwardParams forward = AsForward(params);
  KernelStatus status = Validate(forward);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  if (s.total_q > 0 && (params.dout == nullptr || params.dq == nullptr)) {
    return Error("dout and dq must be set");
  }
  if (s.total_k > 0 && (params.dk == nullptr || params.dv == nullptr)) {
    return Error("dk and dv must be set");
  }
  const size_t elem = static_cast<size_t>(DTypeSize(s.dtype));
  if (!AlignedTo(params.dout, elem) || !AlignedTo(params.dq, elem) ||
      !AlignedTo(params.dk, elem) || !AlignedTo(params.dv, elem)) {
    return Error("dout, dq, dk and dv must be aligned to their element size");
  }
  if (s.total_q == 0 && s.total_k == 0) return KernelStatus::Ok();
  if (s.batch == 0) return Error("total_q or total_k > 0 needs batch > 0");
  if ((s.total_q > 0 && s.max_seqlen_q == 0) || (s.total_k > 0 && s.max_seqlen_k == 0)) {
    return Error("max_seqlen_q/_k must be set when total_q/_k > 0");
  }
  const size_t workspace = BackwardWorkspaceBytes(params);
  if (ctx.workspace_bytes < workspace || (workspace > 0 && ctx.workspace == nullptr)) {
    return Error("backward needs a workspace of " + std::to_string(workspace) +
                 " bytes (BackwardWorkspaceBytes), got " + std::to_string(ctx.workspace_bytes));
  }
  if (!AlignedTo(ctx.workspace, 16)) return Error("workspace must be 16-byte aligned");
  DeviceInfo info{};
  status = SelectPath(s.dtype, ctx, &info);
  if (!status.ok) return status;

  BwdArgs args{};
  args.fwd = MakeForwardArgs(forward);
  args.fwd.vector_io = args.fwd.vector_io && AlignedTo(params.dout, 16) &&
                       AlignedTo(params.dq, 16) && AlignedTo(params.dk, 16) &&
                       AlignedTo(params.dv, 16);
  args.dout = params.dout;
  args.dq = params.dq;
  args.dk = params.dk;
  args.dv = params.dv;
  args.dsum = static_cast<float*>(ctx.workspace);
  args.grad_scale = params.options.softmax_scale;
  const BucketEntry* bucket = FindBucket(s.head_dim);
  const LaunchShape shape{s.batch, s.max_seqlen_q, s.max_seqlen_k, info.smem_limit};
  const bool extras = HasExtras(params.options);
  DeviceAlibiSlopes slopes;  // freed in stream order after the launches
  if (std::string problem =
          slopes.Init(params.options, s, static_cast<cudaStream_t>(ctx.stream));
      !problem.empty()) {
    return Error(problem);
  }
  return bucket->backward[extras][DTypeIndex(s.dtype)](
      args, MakeExtrasArgs(params.options, args.fwd.lse_scale, slopes), info.path, shape,
      ctx.stream);
}

}  // namespace attnserve::kernels::fallback
