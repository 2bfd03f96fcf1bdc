// The flash family's plan: FlashAttention-2-class kernels on sm80+ (the Hopper ones where
// kernels/flash_sm90_rule.h says so) and their Turing variant on 7.5. Compiled into attn_kernels
// (plain C++, no CUDA) with the flash library's ATTN_FLASH_*HDIM_* definitions, so it knows
// which kernels this build holds as the dispatcher's tables do.
#include "kernels/family_plans.h"
#include "kernels/flash/shared_memory.h"
#include "kernels/flash/tile_config.h"
#include "kernels/flash_sm90_rule.h"

namespace attnserve::kernels::flash {
namespace {

// Whether the build instantiated `head_dim` for the sm80 kernels / the sm90 forward / the sm90
// backward (kernels/flash/CMakeLists.txt).
bool Built(int head_dim) {
  switch (head_dim) {
#ifdef ATTN_FLASH_HDIM_32
    case 32: return true;
#endif
#ifdef ATTN_FLASH_HDIM_64
    case 64: return true;
#endif
#ifdef ATTN_FLASH_HDIM_96
    case 96: return true;
#endif
#ifdef ATTN_FLASH_HDIM_128
    case 128: return true;
#endif
#ifdef ATTN_FLASH_HDIM_192
    case 192: return true;
#endif
#ifdef ATTN_FLASH_HDIM_256
    case 256: return true;
#endif
    default: return false;
  }
}

bool Sm90Built(bool backward, int head_dim) {
  switch (head_dim) {
#ifdef ATTN_FLASH_SM90_HDIM_64
    case 64: if (!backward) return true; break;
#endif
#ifdef ATTN_FLASH_SM90_HDIM_128
    case 128: if (!backward) return true; break;
#endif
#ifdef ATTN_FLASH_SM90_HDIM_256
    case 256: if (!backward) return true; break;
#endif
    default: break;
  }
  switch (head_dim) {
#ifdef ATTN_FLASH_SM90_BWD_HDIM_64
    case 64: return backward;
#endif
#ifdef ATTN_FLASH_SM90_BWD_HDIM_128
    case 128: return backward;
#endif
#ifdef ATTN_FLASH_SM90_BWD_HDIM_192
    case 192: return backward;
#endif
#ifdef ATTN_FLASH_SM90_BWD_HDIM_256
    case 256: return backward;
#endif
    default: return false;
  }
}

// The instantiated head dim a request runs at: the smallest built one that holds it (0: none),
// as the dispatcher's FindKernel does.
int KernelHeadDim(int head_dim) {
  for (int dim : kInstantiatedHeadDims) {
    if (dim >= head_dim && Built(dim)) return dim;
  }
  return 0;
}

}  // namespace

std::vector<CoverageRule> Coverage(int compute_capability) {
  constexpr int kSm80 = Sm80::kComputeCapability, kSm75 = Sm75::kComputeCapability;
  constexpr int kGranule = kHeadDimGranule;
  constexpr Direction kFwd = Direction::kForward, kBwd = Direction::kBackward;
  const std::vector<DType> half = {DType::kFloat16, DType::kBFloat16};
  if (compute_capability >= kSm80) {
    return {MakeRule(kFwd, kSm80, kAnyComputeCapability, half, kGranule, kMaxHeadDim, kGranule,
                     /*extras=*/true,
                     "FlashAttention-2-class kernels (sm80+ mma.sync m16n8k16): fp16/bf16, "
                     "head_dim a multiple of 8 up to 256; dropout and ALiBi (sm80 kernels, on "
                     "Hopper too)"),
            MakeRule(kBwd, kSm80, kAnyComputeCapability, half, kGranule, kMaxBackwardHeadDim,
                     kGranule, /*extras=*/true,
                     "FlashAttention-2-class backward (sm80+): fp16/bf16, head_dim a multiple of "
                     "8 up to 256; dropout and ALiBi (sm80 kernels, on Hopper too)")};
  }
  if (compute_capability >= kSm75) {
    return {MakeRule(kFwd, kSm75, kSm80, {DType::kFloat16}, kGranule, Sm75::kMaxHeadDim, kGranule,
                     /*extras=*/false,
                     "flash on Turing (mma.sync m16n8k8, 64 KB shared memory): fp16, head_dim a "
                     "multiple of 8 up to 64; no dropout or ALiBi"),
            MakeRule(kBwd, kSm75, kSm80, {DType::kFloat16}, kGranule, Sm75::kMaxHeadDim, kGranule,
                     /*extras=*/false,
                     "flash backward on Turing: fp16, head_dim a multiple of 8 up to 64; no "
                     "dropout or ALiBi")};
  }
  return {};
}

KernelPlan Plan(const PlanQuery& query) {
  std::string why_not;
  const std::vector<CoverageRule> rules = Coverage(query.compute_capability);
  const CoverageRule* rule = MatchRule(rules, query, &why_not);
  if (rule == nullptr) return PlanFromRule(nullptr, why_not, "");
  const bool backward = query.direction == Direction::kBackward;
  const bool turing = query.compute_capability < Sm80::kComputeCapability;
  KernelPlan plan = PlanFromRule(rule, "", turing ? Sm75::kName : Sm80::kName);
  plan.shared_memory_bytes =
      SharedMemoryBytes(backward, query.head_dim, query.compute_capability);
  if (plan.shared_memory_bytes == 0) {
    plan.ok = false;
    plan.reason = "no kernel for head_dim " + std::to_string(query.head_dim);
    return plan;
  }
  const int limit = query.shared_memory_per_block;
  if (limit > 0 && plan.shared_memory_bytes > limit) {
    plan.ok = false;
    plan.reason = "its kernel for head_dim " + std::to_string(query.head_dim) + " needs " +
                  std::to_string(plan.shared_memory_bytes) +
                  " bytes of shared memory per block; the device allows " +
                  std::to_string(limit);
    return plan;
  }
  if (turing) return plan;
  const int kernel_head_dim = KernelHeadDim(query.head_dim);
  Sm90Candidate sm90;
  sm90.backward = backward;
  sm90.compute_capability = query.compute_capability;
  sm90.device_compute_capability = query.device_compute_capability != 0
                                       ? query.device_compute_capability
                                       : query.compute_capability;
  sm90.kernel_built = kernel_head_dim != 0 && Sm90Built(backward, kernel_head_dim);
  sm90.kernel_shared_memory = !sm90.kernel_built ? 0
                              : backward         ? Sm90BackwardMaxSmemBytes(kernel_head_dim)
                                                 : Sm90ForwardSmemBytes(kernel_head_dim);
  sm90.shared_memory_limit = limit;
  sm90.extras = query.dropout || query.alibi;
  sm90.disabled_paths = query.disabled_paths;
  if (RunsSm90(sm90)) {
    plan.code_path = Sm90::kName;
    plan.shared_memory_bytes = sm90.kernel_shared_memory;
  }
  return plan;
}

void Pin(const KernelPlan& plan, ExecutionContext* ctx) {
  if (plan.code_path != Sm90::kName) ctx->disabled_paths |= kPathSm90Forward | kPathSm90Backward;
  if (plan.code_path == Sm75::kName &&
      (ctx->compute_capability == 0 || ctx->compute_capability > Sm75::kComputeCapability)) {
    ctx->compute_capability = Sm75::kComputeCapability;
  }
}

}  // namespace attnserve::kernels::flash
