// The fallback family's plan: memory-efficient tiled kernels for sm70+, every dtype, head dims
// up to its largest bucket. Its code path follows dtype and architecture exactly as its
// dispatcher's SelectPath (fallback_attention.cc) does; its tiles are sized to the device's
// shared memory, so that never rules it out.
#include "kernels/family_plans.h"

namespace attnserve::kernels::fallback {
namespace {

// fp16: mma.sync m16n8k16 from sm80, m16n8k8 on Turing, wmma on Volta; bf16 needs sm80's
// tensor cores, else (and for fp32) CUDA-core FMAs.
const char* CodePath(DType dtype, int cc) {
  if (dtype == DType::kFloat16) return cc >= 80 ? "sm80" : cc >= 75 ? "sm75" : "sm70-wmma";
  if (dtype == DType::kBFloat16 && cc >= 80) return "sm80";
  return "simt";
}

}  // namespace

std::vector<CoverageRule> Coverage(int compute_capability) {
  constexpr int kMinComputeCapability = 70;
  constexpr int kMaxHeadDim = 256;  // the largest bucket (ATTN_FALLBACK_HEAD_DIMS)
  if (compute_capability < kMinComputeCapability) return {};
  auto rule = [](Direction direction, const char* reason) {
    return MakeRule(direction, kMinComputeCapability, kAnyComputeCapability, AllDTypes(), 1,
                    kMaxHeadDim, 1, /*extras=*/true, reason);
  };
  return {rule(Direction::kForward,
               "memory-efficient tiled kernels for sm70+ (tensor cores for fp16, and bf16 on "
               "sm80+): every dtype, head_dim 1..256; dropout and ALiBi"),
          rule(Direction::kBackward,
               "memory-efficient tiled backward for sm70+: every dtype, head_dim 1..256; "
               "dropout and ALiBi")};
}

KernelPlan Plan(const PlanQuery& query) {
  return PlanByRules(Coverage(query.compute_capability), query,
                     CodePath(query.dtype, query.compute_capability));
}

}  // namespace attnserve::kernels::fallback
