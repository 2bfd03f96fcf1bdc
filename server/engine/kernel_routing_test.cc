#include "server/engine/kernel_routing.h"

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

using kernels::DType;

const KernelCatalog kAllFamilies{{"flash", "fallback", "cublas", "reference"}};

std::string Family(int cc, Direction dir, DType dtype, int head_dim,
                   const KernelCatalog& catalog = kAllFamilies) {
  return ChooseRoute({cc, dir, dtype, head_dim}, catalog).family;
}

// The routing rule as the fallback issue states it, written independently of the table.
std::string Expected(int cc, Direction dir, DType dtype, int head_dim) {
  if (cc == 0) return "reference";
  const bool fp16 = dtype == DType::kFloat16, half = dtype != DType::kFloat32;
  if (cc >= 80 && half && head_dim % 8 == 0 &&
      head_dim <= (dir == Direction::kForward ? 256 : 128)) {
    return "flash";
  }
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
          EXPECT_EQ(Family(cc, dir, dtype, head_dim), Expected(cc, dir, dtype, head_dim));
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

TEST(KernelRoutingTest, FamiliesNotBuiltAreNeverChosen) {
  const KernelCatalog reference_only{{"reference"}};
  EXPECT_EQ(Family(90, Direction::kForward, DType::kBFloat16, 128, reference_only), "reference");
  const KernelCatalog no_fallback{{"flash", "cublas", "reference"}};
  EXPECT_EQ(Family(75, Direction::kForward, DType::kFloat32, 64, no_fallback), "cublas");
}

TEST(KernelRoutingTest, ForcedFamilyThatCannotRunExplainsWhy) {
  const Route route =
      ChooseRoute({90, Direction::kBackward, DType::kFloat16, 256}, KernelCatalog::Only("flash"));
  EXPECT_EQ(route.family, "");
  EXPECT_NE(route.reason.find("backward of float16 with head_dim 256 on compute capability 9.0"),
            std::string::npos)
      << route.reason;
  EXPECT_EQ(ChooseRoute({75, Direction::kBackward, DType::kFloat16, 128},
                        KernelCatalog::Only("fallback"))
                .family,
            "fallback");
}

TEST(KernelRoutingTest, RoutesExplainThemselves) {
  const Route route = ChooseRoute({90, Direction::kBackward, DType::kFloat16, 256}, kAllFamilies);
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
  for (const CoverageRow& row : CoverageFor(90, kAllFamilies)) {
    if (families.empty() || families.back() != row.family) families.push_back(row.family);
  }
  EXPECT_EQ(families, (std::vector<std::string>{"flash", "fallback", "cublas", "reference"}));
}

TEST(KernelRoutingTest, CoverageListsWhatEachDeviceServes) {
  const std::vector<CoverageRow> turing = CoverageFor(75, kAllFamilies);
  ASSERT_EQ(turing.size(), 8u);  // flash, fallback, cublas, reference x 2 directions
  EXPECT_EQ(turing[0].family, "flash");
  EXPECT_EQ(turing[0].dtypes, std::vector<DType>{DType::kFloat16});
  EXPECT_EQ(turing[0].max_head_dim, 64);
  EXPECT_EQ(turing[0].head_dim_multiple, 8);
  const std::vector<CoverageRow> cpu = CoverageFor(0, kAllFamilies);
  ASSERT_EQ(cpu.size(), 2u);
  EXPECT_EQ(cpu[0].family, "reference");
  EXPECT_EQ(CoverageFor(90, KernelCatalog{{"reference"}}).size(), 2u);
}

}  // namespace
}  // namespace attnserve::engine
