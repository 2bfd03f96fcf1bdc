// Each kernel family's plan (kernels/family_plans.h): the code path it picks, the shared memory
// it needs, why it refuses what it cannot run, how its path is pinned, and that its coverage
// rules and its plan say the same thing.
#include "kernels/family_plans.h"

#include <cstdint>
#include <string>
#include <string_view>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernel_families.h"

namespace attnserve::kernels {
namespace {

using ::testing::HasSubstr;

PlanQuery Query(Direction direction, DType dtype, int head_dim, int cc, int smem = 0) {
  PlanQuery q;
  q.direction = direction;
  q.dtype = dtype;
  q.head_dim = head_dim;
  q.compute_capability = cc;
  q.shared_memory_per_block = smem;
  return q;
}

constexpr Direction kFwd = Direction::kForward;
constexpr Direction kBwd = Direction::kBackward;

TEST(FamilyPlansTest, ReferenceRunsEverythingOnTheCpu) {
  const KernelPlan plan = reference::Plan(Query(kBwd, DType::kBFloat16, 512, 0));
  EXPECT_TRUE(plan.ok);
  EXPECT_EQ(plan.code_path, "cpu");
  EXPECT_THAT(plan.reason, HasSubstr("exact CPU kernels"));
}

TEST(FamilyPlansTest, CublasNeedsVoltaAndTakesAnyHeadDim) {
  const KernelPlan plan = cublas::Plan(Query(kFwd, DType::kFloat32, 1000, 70));
  EXPECT_TRUE(plan.ok);
  EXPECT_EQ(plan.code_path, "gemm");
  const KernelPlan cpu = cublas::Plan(Query(kFwd, DType::kFloat32, 64, 0));
  EXPECT_FALSE(cpu.ok);
  EXPECT_THAT(cpu.reason, HasSubstr("compute capability 0.0"));
}

TEST(FamilyPlansTest, FallbackPathFollowsDtypeAndArchitecture) {
  EXPECT_EQ(fallback::Plan(Query(kFwd, DType::kFloat16, 64, 90)).code_path, "sm80");
  EXPECT_EQ(fallback::Plan(Query(kFwd, DType::kFloat16, 64, 75)).code_path, "sm75");
  EXPECT_EQ(fallback::Plan(Query(kBwd, DType::kFloat16, 64, 70)).code_path, "sm70-wmma");
  EXPECT_EQ(fallback::Plan(Query(kFwd, DType::kBFloat16, 64, 75)).code_path, "simt");
  EXPECT_EQ(fallback::Plan(Query(kFwd, DType::kFloat32, 64, 90)).code_path, "simt");
  const KernelPlan wide = fallback::Plan(Query(kFwd, DType::kFloat16, 264, 90));
  EXPECT_FALSE(wide.ok);
  EXPECT_THAT(wide.reason, HasSubstr("head_dim 264 is not supported (1..256)"));
}

TEST(FamilyPlansTest, FlashSaysWhyNot) {
  const KernelPlan fp32 = flash::Plan(Query(kFwd, DType::kFloat32, 64, 90));
  EXPECT_FALSE(fp32.ok);
  EXPECT_THAT(fp32.reason, HasSubstr("float32 is not supported"));
  const KernelPlan turing_bf16 = flash::Plan(Query(kFwd, DType::kBFloat16, 64, 75));
  EXPECT_FALSE(turing_bf16.ok);
  EXPECT_THAT(turing_bf16.reason, HasSubstr("compute capability 7.5"));
  PlanQuery dropout = Query(kFwd, DType::kFloat16, 64, 75);
  dropout.dropout = true;
  EXPECT_THAT(flash::Plan(dropout).reason, HasSubstr("dropout is not supported"));
  EXPECT_THAT(flash::Plan(Query(kFwd, DType::kFloat16, 64, 70)).reason,
              HasSubstr("no forward kernels for compute capability 7.0"));
  EXPECT_THAT(flash::Plan(Query(kFwd, DType::kFloat16, 100, 80)).reason,
              HasSubstr("multiples of 8"));
}

TEST(FlashPlanTest, SharedMemoryShortfallIsNamedWithTheBytes) {
  // sm86's 99 KB per block holds the backward up to head_dim 96, not 128.
  const KernelPlan plan = flash::Plan(Query(kBwd, DType::kBFloat16, 128, 86, 99 * 1024));
  EXPECT_FALSE(plan.ok);
  EXPECT_EQ(plan.shared_memory_bytes, 123904);
  EXPECT_THAT(plan.reason, HasSubstr("123904 bytes of shared memory per block"));
  const KernelPlan fits = flash::Plan(Query(kBwd, DType::kBFloat16, 96, 86, 99 * 1024));
  EXPECT_TRUE(fits.ok);
  EXPECT_EQ(fits.code_path, "sm80");
  EXPECT_GT(fits.shared_memory_bytes, 0);
}

TEST(FlashPlanTest, TuringAndAmpereRunTheirOwnPaths) {
  EXPECT_EQ(flash::Plan(Query(kFwd, DType::kFloat16, 64, 75)).code_path, "sm75");
  EXPECT_EQ(flash::Plan(Query(kBwd, DType::kBFloat16, 128, 80)).code_path, "sm80");
  // An Ampere path emulated on a Hopper GPU stays the Ampere path.
  PlanQuery emulated = Query(kFwd, DType::kFloat16, 128, 80);
  emulated.device_compute_capability = 90;
  EXPECT_EQ(flash::Plan(emulated).code_path, "sm80");
}

// Hopper: the sm90 kernels where this build holds them (the backward in both modes), except for
// what only the sm80 kernels do (dropout, ALiBi) or what the context switches off.
TEST(FlashPlanTest, HopperRunsSm90WhereBuiltAndAllowed) {
  PlanQuery q = Query(kFwd, DType::kBFloat16, 128, 90, 227 * 1024);
#if defined(ATTN_FLASH_SM90_HDIM_128)
  EXPECT_EQ(flash::Plan(q).code_path, "sm90");
#else
  EXPECT_EQ(flash::Plan(q).code_path, "sm80");
#endif
  PlanQuery extras = q;
  extras.alibi = true;
  EXPECT_EQ(flash::Plan(extras).code_path, "sm80");
  PlanQuery disabled = q;
  disabled.disabled_paths = kPathSm90Forward;
  EXPECT_EQ(flash::Plan(disabled).code_path, "sm80");
  PlanQuery newer = q;  // sm_90a code does not run on later architectures
  newer.compute_capability = newer.device_compute_capability = 100;
  EXPECT_EQ(flash::Plan(newer).code_path, "sm80");
  // The deterministic mode runs the Hopper dK/dV kernel without dQ and then the dQ kernel.
  for (const bool deterministic : {false, true}) {
    PlanQuery backward = Query(kBwd, DType::kFloat16, 128, 90, 227 * 1024);
    backward.deterministic = deterministic;
#if defined(ATTN_FLASH_SM90_BWD_HDIM_128)
    EXPECT_EQ(flash::Plan(backward).code_path, "sm90") << deterministic;
#else
    EXPECT_EQ(flash::Plan(backward).code_path, "sm80") << deterministic;
#endif
    PlanQuery wide = Query(kBwd, DType::kBFloat16, 256, 90, 227 * 1024);
    wide.deterministic = deterministic;
#if defined(ATTN_FLASH_SM90_BWD_HDIM_256)
    EXPECT_EQ(flash::Plan(wide).code_path, "sm90") << deterministic;
#else
    EXPECT_EQ(flash::Plan(wide).code_path, "sm80") << deterministic;
#endif
    wide.alibi = true;
    EXPECT_EQ(flash::Plan(wide).code_path, "sm80") << deterministic;
  }
}

TEST(FlashPlanTest, PinMakesTheDispatcherRunThePlannedPath) {
  KernelPlan plan;
  plan.ok = true;
  plan.code_path = "sm80";
  ExecutionContext ctx;
  ctx.compute_capability = 90;
  flash::Pin(plan, &ctx);
  EXPECT_EQ(ctx.disabled_paths, kPathSm90Forward | kPathSm90Backward);
  EXPECT_EQ(ctx.compute_capability, 90);

  plan.code_path = "sm90";
  ExecutionContext hopper;
  flash::Pin(plan, &hopper);
  EXPECT_EQ(hopper.disabled_paths, 0u);

  plan.code_path = "sm75";
  ExecutionContext turing;
  turing.compute_capability = 86;
  flash::Pin(plan, &turing);
  EXPECT_EQ(turing.compute_capability, 75);
}

// The rules a family lists (ServerInfo) and the queries its plan accepts are one thing: every
// family plans exactly what one of its rules covers, on every architecture.
TEST(FamilyPlansTest, CoverageAndPlanAgree) {
  for (const KernelFamilyEntry& family : KnownKernelFamilies()) {
    for (int cc : {0, 70, 75, 80, 86, 90}) {
      const std::vector<CoverageRule> rules = family.coverage(cc);
      for (Direction dir : {kFwd, kBwd}) {
        for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
          for (int d : {1, 8, 40, 64, 72, 128, 136, 256, 264, 512}) {
            const PlanQuery q = Query(dir, dtype, d, cc);
            std::string why_not;
            const bool covered = MatchRule(rules, q, &why_not) != nullptr;
            SCOPED_TRACE(testing::Message() << family.name << " cc " << cc << " "
                                            << DirectionName(dir) << " "
                                            << DTypeName(dtype) << " d " << d);
            EXPECT_EQ(family.plan(q).ok, covered) << family.plan(q).reason;
          }
        }
      }
    }
  }
}

TEST(FamilyPlansTest, EveryFamilyIsKnownEvenWhereItsKernelsAreNotBuilt) {
  for (const char* name : {"reference", "flash", "fallback", "cublas"}) {
    const KernelFamilyEntry* family = FindKnownKernelFamily(name);
    ASSERT_NE(family, nullptr) << name;
    EXPECT_NE(family->plan, nullptr);
    EXPECT_NE(family->coverage, nullptr);
  }
  EXPECT_NE(FindKernelFamily("reference"), nullptr);
}

// The flash backward's workspace follows the planned code path: its Hopper path at head dims
// 200-256 computes dQ in a pass of its own in both modes, so it takes no float32 dQ
// accumulator there; every other path in the atomic mode does, and an empty code path (a caller
// that does not know it) gets the most any path needs.
TEST(FamilyPlansTest, FlashBackwardWorkspaceFollowsThePlannedCodePath) {
  const KernelFamilyEntry* flash = FindKernelFamily("flash");
  if (flash == nullptr) GTEST_SKIP() << "flash is not built";
  const int32_t cu[] = {0, 100, 300};
  BackwardParams params;
  params.shape.dtype = DType::kBFloat16;
  params.shape.batch = 2;
  params.shape.total_q = params.shape.total_k = 300;
  params.shape.num_heads = params.shape.num_heads_k = 8;
  params.shape.cu_seqlens_q = params.shape.cu_seqlens_k = cu;
  params.shape.max_seqlen_q = params.shape.max_seqlen_k = 200;
  auto bytes = [&](int head_dim, bool deterministic, std::string_view code_path) {
    params.shape.head_dim = head_dim;
    params.deterministic = deterministic;
    return flash->backward_workspace_bytes(params, code_path);
  };
  const size_t accumulator_128 = 300 * 8 * 128 * 4;
  EXPECT_GE(bytes(128, false, "") - bytes(128, true, ""), accumulator_128);
  EXPECT_EQ(bytes(128, false, "sm90"), bytes(128, false, ""));  // dQ by tile: kept
  EXPECT_EQ(bytes(128, false, "sm80"), bytes(128, false, ""));
#if defined(ATTN_FLASH_HDIM_256)
  for (int head_dim : {200, 256}) {
    SCOPED_TRACE(head_dim);
    EXPECT_EQ(bytes(head_dim, false, "sm90"), bytes(head_dim, true, ""));
    EXPECT_GE(bytes(head_dim, false, "") - bytes(head_dim, false, "sm90"),
              size_t{300} * 8 * head_dim * 4);
    EXPECT_EQ(bytes(head_dim, false, "sm80"), bytes(head_dim, false, ""));
    EXPECT_EQ(bytes(head_dim, false, "sm75"), bytes(head_dim, false, ""));
  }
#endif
}

}  // namespace
}  // namespace attnserve::kernels
