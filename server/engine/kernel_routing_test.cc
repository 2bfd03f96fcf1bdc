#include "server/engine/kernel_routing.h"

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

using kernels::DType;

std::string Family(int cc, Direction dir, DType dtype, int head_dim, bool flash_built = true) {
  return ChooseRoute({cc, dir, dtype, head_dim}, KernelCatalog{flash_built}).family;
}

TEST(KernelRoutingTest, TableOverSyntheticDevices) {
  for (int cc : {0, 70, 75, 80, 86, 89, 90}) {
    for (Direction dir : {Direction::kForward, Direction::kBackward}) {
      for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
        for (int head_dim : {1, 8, 40, 64, 96, 128, 136, 192, 256, 264}) {
          const bool flash = cc >= 80 && dtype != DType::kFloat32 && head_dim % 8 == 0 &&
                             head_dim <= (dir == Direction::kForward ? 256 : 128);
          SCOPED_TRACE(testing::Message() << "cc " << cc << " dir " << static_cast<int>(dir)
                                          << " dtype " << static_cast<int>(dtype) << " d "
                                          << head_dim);
          EXPECT_EQ(Family(cc, dir, dtype, head_dim), flash ? "flash" : "reference");
        }
      }
    }
  }
}

TEST(KernelRoutingTest, FamiliesNotBuiltAreNeverChosen) {
  EXPECT_EQ(Family(90, Direction::kForward, DType::kBFloat16, 128, /*flash_built=*/false),
            "reference");
}

TEST(KernelRoutingTest, RoutesExplainThemselves) {
  const Route route = ChooseRoute({90, Direction::kBackward, DType::kFloat16, 256}, {true});
  EXPECT_EQ(route.family, "reference");
  EXPECT_FALSE(route.reason.empty());
  EXPECT_TRUE(Covers("flash", {90, Direction::kForward, DType::kFloat16, 256}, {true}));
  EXPECT_FALSE(Covers("flash", {75, Direction::kForward, DType::kFloat16, 64}, {true}));
  EXPECT_FALSE(Covers("no-such-family", {90, Direction::kForward, DType::kFloat16, 64}, {true}));
  EXPECT_EQ(KnownFamilies(), (std::vector<std::string>{"flash", "reference"}));
}

}  // namespace
}  // namespace attnserve::engine
