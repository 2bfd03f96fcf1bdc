#include "server/engine/kernel_routing.h"

#include "gtest/gtest.h"
#include "kernels/kernel_families.h"

namespace attnserve::engine {
namespace {

using kernels::DType;

const KernelCatalog kAllFamilies{{"flash", "fallback", "cublas", "reference"}};

std::string Family(int cc, Direction dir, DType dtype, int head_dim,
                   const KernelCatalog& catalog = kAllFamilies, int shared_memory = 0) {
  return ChooseRoute({cc, dir, dtype, head_dim, shared_memory}, catalog).family;
}

// Opt-in shared memory per block of real GPUs of each capability (0: the CPU).
int SharedMemoryOf(int cc) {
  switch (cc) {
    case 70: return 96 * 1024;
    case 75: return 64 * 1024;
    case 80: return 163 * 1024;
    case 86: case 89: return 99 * 1024;
    case 90: return 227 * 1024;
    default: return 0;
  }
}

// The routing rule as the fallback issue states it, written independently of the table; on
// sm86/89 (99 KB per block) flash's forward fits up to head_dim 128 and its backward up to 96
// (kernels/flash/tile_config.h: 100 KB forward at 192, 121 KB backward at 128, 119 / 150 KB at
// 192 / 256, which an A100's 163 KB holds).
std::string Expected(int cc, Direction dir, DType dtype, int head_dim) {
  if (cc == 0) return "reference";
  const bool fp16 = dtype == DType::kFloat16, half = dtype != DType::kFloat32;
  const bool small_smem = cc == 86 || cc == 89;
  const int flash_max = dir == Direction::kForward ? (small_smem ? 128 : 256)
                                                   : (small_smem ? 96 : 256);
  if (cc >= 80 && half && head_dim % 8 == 0 && head_dim <= flash_max) return "flash";
  if (cc == 75 && fp16 && head_dim % 8 == 0 && head_dim <= 64) return "flash";  // Turing
  if (head_dim <= 256) return "fallback";  // Volta, and what flash can't do elsewhere
  return "cublas";
}

TEST(KernelRoutingTest, TableOverSyntheticDevices) {
  for (int cc : {0, 70, 75, 80, 86, 89, 90}) {
    for (Direction dir : {Direction::kForward, Direction::kBackward}) {
      for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
        for (int head_dim : {1, 7, 8, 40, 64, 72, 96, 128, 136, 192, 200, 256, 264, 512}) {
          SCOPED_TRACE(testing::Message() << "cc " << cc << " " << DirectionName(dir) << " "
                                          << kernels::DTypeName(dtype) << " d " << head_dim);
          EXPECT_EQ(Family(cc, dir, dtype, head_dim, kAllFamilies, SharedMemoryOf(cc)),
                    Expected(cc, dir, dtype, head_dim));
        }
      }
    }
  }
}

TEST(KernelRoutingTest, TuringSendsLargeHeadDimsAndBf16ToFallback) {
  EXPECT_EQ(Family(75, Direction::kBackward, DType::kFloat16, 64), "flash");
  EXPECT_EQ(Family(75, Direction::kBackward, DType::kFloat16, 128), "fallback");
  EXPECT_EQ(Family(75, Direction::kForward, DType::kBFloat16, 64), "fallback");
  EXPECT_EQ(Family(70, Direction::kForward, DType::kFloat16, 64), "fallback");
}

TEST(KernelRoutingTest, KernelsThatNeedMoreSharedMemoryThanTheDeviceGoToFallback) {
  const int rtx = 99 * 1024, a100 = 163 * 1024;
  EXPECT_EQ(Family(86, Direction::kBackward, DType::kBFloat16, 128, kAllFamilies, rtx),
            "fallback");
  EXPECT_EQ(Family(86, Direction::kBackward, DType::kBFloat16, 96, kAllFamilies, rtx), "flash");
  EXPECT_EQ(Family(89, Direction::kForward, DType::kFloat16, 192, kAllFamilies, rtx), "fallback");
  EXPECT_EQ(Family(80, Direction::kForward, DType::kFloat16, 256, kAllFamilies, a100), "flash");
  EXPECT_EQ(Family(80, Direction::kBackward, DType::kFloat16, 128, kAllFamilies, a100), "flash");
  EXPECT_EQ(Family(80, Direction::kBackward, DType::kFloat16, 256, kAllFamilies, a100), "flash");
  EXPECT_EQ(Family(86, Direction::kBackward, DType::kFloat16, 192, kAllFamilies, rtx),
            "fallback");
  // Unknown (0): not checked.
  EXPECT_EQ(Family(86, Direction::kBackward, DType::kBFloat16, 128, kAllFamilies, 0), "flash");
  // Forced flash on a device it does not fit: no route, and the reason says so.
  const Route forced =
      ChooseRoute({86, Direction::kBackward, DType::kBFloat16, 128, rtx},
                  KernelCatalog::Only("flash"));
  EXPECT_TRUE(forced.family.empty());
  EXPECT_NE(forced.reason.find("head_dim 128"), std::string::npos) << forced.reason;
  EXPECT_NE(forced.reason.find("123904 bytes of shared memory per block; the device allows "
                               "101376"),
            std::string::npos)
      << forced.reason;
}

TEST(KernelRoutingTest, CoverageCutsHeadDimsToWhatFitsTheDevice) {
  int flash_rows = 0;
  for (const CoverageRow& row : CoverageFor(86, 99 * 1024, kAllFamilies)) {
    if (row.family != "flash") continue;
    ++flash_rows;
    EXPECT_EQ(row.max_head_dim, row.direction == Direction::kForward ? 128 : 96);
    EXPECT_NE(row.reason.find("99 KB of shared memory"), std::string::npos) << row.reason;
  }
  EXPECT_EQ(flash_rows, 2);
  for (const CoverageRow& row : CoverageFor(80, 163 * 1024, kAllFamilies)) {
    if (row.family != "flash") continue;
    EXPECT_EQ(row.max_head_dim, 256);
    EXPECT_EQ(row.reason.find("shared memory per block"), std::string::npos) << row.reason;
  }
  // A device too small for every flash kernel lists no flash row at all.
  for (const CoverageRow& row : CoverageFor(80, 16 * 1024, kAllFamilies)) {
    EXPECT_NE(row.family, "flash");
  }
}

TEST(KernelRoutingTest, FamiliesNotBuiltAreNeverChosen) {
  const KernelCatalog reference_only{{"reference"}};
  EXPECT_EQ(Family(90, Direction::kForward, DType::kBFloat16, 128, reference_only), "reference");
  const KernelCatalog no_fallback{{"flash", "cublas", "reference"}};
  EXPECT_EQ(Family(75, Direction::kForward, DType::kFloat32, 64, no_fallback), "cublas");
}

TEST(KernelRoutingTest, ForcedFamilyThatCannotRunExplainsWhy) {
  const Route route =
      ChooseRoute({90, Direction::kBackward, DType::kFloat16, 264}, KernelCatalog::Only("flash"));
  EXPECT_EQ(route.family, "");
  EXPECT_NE(route.reason.find("backward of float16 with head_dim 264 on compute capability 9.0"),
            std::string::npos)
      << route.reason;
  EXPECT_EQ(ChooseRoute({75, Direction::kBackward, DType::kFloat16, 128},
                        KernelCatalog::Only("fallback"))
                .family,
            "fallback");
}

TEST(KernelRoutingTest, RoutesExplainThemselves) {
  const Route route = ChooseRoute({90, Direction::kBackward, DType::kFloat32, 256}, kAllFamilies);
  EXPECT_EQ(route.family, "fallback");
  EXPECT_NE(route.reason.find("head_dim 1..256"), std::string::npos) << route.reason;
  // A catalog of one family is what --kernel forces: it runs the query or nothing does.
  auto only = [](const char* family, int cc, int head_dim) {
    return ChooseRoute({cc, Direction::kForward, DType::kFloat16, head_dim},
                       KernelCatalog::Only(family))
        .family;
  };
  EXPECT_EQ(only("flash", 90, 256), "flash");
  EXPECT_EQ(only("flash", 75, 64), "flash");
  EXPECT_EQ(only("flash", 70, 64), "");
  EXPECT_EQ(only("no-such-family", 90, 64), "");
  std::vector<std::string> families;  // the table's families, best first
  for (const CoverageRow& row : CoverageFor(90, 0, kAllFamilies)) {
    if (families.empty() || families.back() != row.family) families.push_back(row.family);
  }
  EXPECT_EQ(families, (std::vector<std::string>{"flash", "fallback", "cublas", "reference"}));
}

TEST(KernelRoutingTest, CoverageListsWhatEachDeviceServes) {
  const std::vector<CoverageRow> turing = CoverageFor(75, 0, kAllFamilies);
  ASSERT_EQ(turing.size(), 8u);  // flash, fallback, cublas, reference x 2 directions
  EXPECT_EQ(turing[0].family, "flash");
  EXPECT_EQ(turing[0].dtypes, std::vector<DType>{DType::kFloat16});
  EXPECT_EQ(turing[0].max_head_dim, 64);
  EXPECT_EQ(turing[0].head_dim_multiple, 8);
  const std::vector<CoverageRow> cpu = CoverageFor(0, 0, kAllFamilies);
  ASSERT_EQ(cpu.size(), 2u);
  EXPECT_EQ(cpu[0].family, "reference");
  EXPECT_EQ(CoverageFor(90, 0, KernelCatalog{{"reference"}}).size(), 2u);
}

}  // namespace
}  // namespace attnserve::engine

namespace attnserve::engine {
namespace {

TEST(KernelRouting, DropoutAndAlibiRouteOnlyToFamiliesThatServeThem) {
  for (bool dropout : {false, true}) {
    for (bool alibi : {false, true}) {
      if (!dropout && !alibi) continue;
      for (Direction direction : {Direction::kForward, Direction::kBackward}) {
        RouteQuery query{0, direction, DType::kFloat16, 64, 0, dropout, alibi};
        EXPECT_EQ(ChooseRoute(query, kAllFamilies).family, "reference");
        // sm80 and Hopper: flash (its sm80 kernels); without flash, fallback; without both,
        // cublas; with none of them, an error naming the option.
        for (int cc : {80, 86, 90}) {
          query.compute_capability = cc;
          EXPECT_EQ(ChooseRoute(query, KernelCatalog{{"flash", "fallback", "cublas"}}).family,
                    "flash");
          EXPECT_EQ(ChooseRoute(query, KernelCatalog{{"fallback", "cublas"}}).family,
                    "fallback");
          EXPECT_EQ(ChooseRoute(query, KernelCatalog{{"cublas"}}).family, "cublas");
        }
        // Turing: fallback, past flash's Turing variant; cublas past fallback's head dims.
        query.compute_capability = 75;
        EXPECT_EQ(ChooseRoute(query, KernelCatalog{{"flash", "fallback", "cublas"}}).family,
                  "fallback");
        RouteQuery wide = query;
        wide.head_dim = 300;
        EXPECT_EQ(ChooseRoute(wide, kAllFamilies).family, "cublas");
        const Route route = ChooseRoute(query, KernelCatalog{{"flash"}});
        EXPECT_EQ(route.family, "");
        if (dropout) EXPECT_NE(route.reason.find("options.dropout_p"), std::string::npos);
        if (alibi) EXPECT_NE(route.reason.find("options.alibi_slopes"), std::string::npos);
        // Past the features, the usual limits hold: flash has no fp32.
        query.compute_capability = 90;
        query.dtype = DType::kFloat32;
        EXPECT_EQ(ChooseRoute(query, KernelCatalog{{"flash", "fallback", "cublas"}}).family,
                  "fallback");
        EXPECT_EQ(ChooseRoute(query, KernelCatalog{{"flash", "cublas"}}).family, "cublas");
      }
    }
  }
}

TEST(KernelRouting, CoverageSaysWhichFamiliesServeDropoutAndAlibi) {
  for (int cc : {75, 90}) {
    for (const CoverageRow& row : CoverageFor(cc, 0, kAllFamilies)) {
      const bool serves = row.family == "reference" || row.family == "cublas" ||
                          row.family == "fallback" || (row.family == "flash" && cc >= 80);
      EXPECT_EQ(row.dropout, serves) << row.family << " at " << cc;
      EXPECT_EQ(row.alibi, serves) << row.family << " at " << cc;
      if (row.family == "flash") {
        EXPECT_EQ(row.reason.find("dropout and ALiBi") != std::string::npos, serves) << cc;
      }
    }
  }
}

}  // namespace
}  // namespace attnserve::engine

namespace attnserve::engine {
namespace {

// Routes name the code path their family plans (kernels/family_plans.h), so placement decides
// the path once and Execution reports it.
TEST(KernelRouting, RoutesCarryTheFamilysCodePath) {
  auto route = [](int cc, Direction dir, DType dtype, int head_dim,
                  const KernelCatalog& catalog = kAllFamilies) {
    return ChooseRoute({cc, dir, dtype, head_dim, SharedMemoryOf(cc)}, catalog);
  };
  EXPECT_EQ(route(0, Direction::kForward, DType::kFloat16, 64).Name(), "reference/cpu");
  EXPECT_EQ(route(75, Direction::kForward, DType::kFloat16, 64).Name(), "flash/sm75");
  EXPECT_EQ(route(86, Direction::kBackward, DType::kBFloat16, 96).Name(), "flash/sm80");
  EXPECT_EQ(route(86, Direction::kBackward, DType::kBFloat16, 128).Name(), "fallback/sm80");
  EXPECT_EQ(route(70, Direction::kForward, DType::kFloat16, 64).Name(), "fallback/sm70-wmma");
  EXPECT_EQ(route(90, Direction::kForward, DType::kFloat32, 512).Name(), "cublas/gemm");
  // Hopper: sm90 or sm80 as the flash plan says for this build, the backward's deterministic
  // mode on the same path as its atomic one; dropout always takes the sm80 kernels.
  const Route hopper = route(90, Direction::kForward, DType::kBFloat16, 128);
  EXPECT_EQ(hopper.family, "flash");
  EXPECT_TRUE(hopper.code_path == "sm90" || hopper.code_path == "sm80") << hopper.code_path;
  RouteQuery backward{90, Direction::kBackward, DType::kFloat16, 128, SharedMemoryOf(90)};
  const Route atomic = ChooseRoute(backward, kAllFamilies);
  EXPECT_EQ(atomic.family, "flash");
  backward.deterministic = true;
  EXPECT_EQ(ChooseRoute(backward, kAllFamilies).code_path, atomic.code_path);
  RouteQuery dropout{90, Direction::kForward, DType::kFloat16, 128, SharedMemoryOf(90), true};
  EXPECT_EQ(ChooseRoute(dropout, kAllFamilies).Name(), "flash/sm80");
  // An older architecture emulated on a Hopper GPU plans that architecture's path.
  RouteQuery emulated{80, Direction::kForward, DType::kFloat16, 128, SharedMemoryOf(80)};
  emulated.device_compute_capability = 90;
  EXPECT_EQ(ChooseRoute(emulated, kAllFamilies).Name(), "flash/sm80");
}

// Each route's reason and shared memory come from its family's plan, not a table of routing's.
TEST(KernelRouting, RouteReasonsComeFromTheFamilies) {
  const Route route = ChooseRoute({86, Direction::kBackward, DType::kBFloat16, 96,
                                   SharedMemoryOf(86)},
                                  kAllFamilies);
  EXPECT_EQ(route.reason,
            kernels::FindKnownKernelFamily("flash")
                ->plan(PlanQueryOf({86, Direction::kBackward, DType::kBFloat16, 96,
                                    SharedMemoryOf(86)}))
                .reason);
  EXPECT_GT(route.shared_memory_bytes, 0);
  EXPECT_LE(route.shared_memory_bytes, SharedMemoryOf(86));
}

}  // namespace
}  // namespace attnserve::engine
