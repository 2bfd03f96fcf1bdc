// Reference forward against the float64 oracle: random shapes per dtype, then one test per
// edge case of the FlashAttention varlen semantics.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "tests/kernels/attention_test_util.h"
#include "kernels/reference/reference_attention.h"

namespace attnserve::kernels::test {
namespace {

constexpr double kLseTolerance = 2e-6;  // fp32 softmax statistics, whatever the input dtype

std::string Describe(const Problem& p) {
  std::string s = std::string(DTypeName(p.dtype)) + " heads " + std::to_string(p.num_heads) +
                  "/" + std::to_string(p.num_heads_k) + " d " + std::to_string(p.head_dim) +
                  " causal " + std::to_string(p.options.causal) + " window " +
                  std::to_string(p.options.window_left) + "," +
                  std::to_string(p.options.window_right) + " softcap " +
                  std::to_string(p.options.softcap) + " lens";
  for (size_t b = 0; b < p.lens_q.size(); ++b) {
    s += " " + std::to_string(p.lens_q[b]) + "x" + std::to_string(p.lens_k[b]);
  }
  return s;
}

// Runs the reference forward and compares out and lse with float64 attention on the same
// (already rounded) inputs. Returns the forward result for further checks.
ForwardResult ExpectForwardMatches(const Case& c, int num_threads = 0) {
  ForwardResult result = RunForward(c, num_threads);
  EXPECT_TRUE(result.status.ok) << result.status.message;
  const NaiveForwardResult want =
      NaiveForward(c.naive(), c.q.ToDoubles(), c.k.ToDoubles(), c.v.ToDoubles());
  EXPECT_LE(RelativeError(result.out.ToDoubles(), want.out), OutputTolerance(c.problem.dtype))
      << Describe(c.problem);
  EXPECT_LE(MaxLseError(result.lse.ToDoubles(), want.lse), kLseTolerance) << Describe(c.problem);
  return result;
}

class ForwardDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(ForwardDTypeTest, MatchesFloat64OnRandomShapes) {
  std::mt19937_64 rng(1234 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 40; ++trial) {
    ExpectForwardMatches(Case(RandomProblem(rng, GetParam()), rng()));
  }
}

TEST_P(ForwardDTypeTest, LongCausalSequenceSpansManyTiles) {
  Problem p = MakeProblem({150, 77}, {200, 77}, 4, 2, 40);
  p.dtype = GetParam();
  p.options.causal = true;
  ExpectForwardMatches(Case(p, 7));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ForwardDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const auto& param_info) {
                           return std::string(DTypeName(param_info.param));
                         });

TEST(ReferenceForward, EmptySequences) {
  Problem p = MakeProblem({0, 5, 0, 4, 3}, {3, 0, 0, 6, 3});
  const Case c(p, 1);
  const ForwardResult r = ExpectForwardMatches(c);
  // Sequence 1 has queries but no keys: out 0, lse +inf.
  const std::vector<double> out = r.out.ToDoubles();
  const std::vector<double> lse = r.lse.ToDoubles();
  for (int64_t row = 0; row < 5; ++row) {
    for (int h = 0; h < p.num_heads; ++h) {
      EXPECT_EQ(lse[h * c.total_q + row], std::numeric_limits<double>::infinity());
      for (int d = 0; d < p.head_dim; ++d) {
        EXPECT_EQ(out[(row * p.num_heads + h) * p.head_dim + d], 0.0);
      }
    }
  }
}

TEST(ReferenceForward, BatchZeroAndTotalZero) {
  ExpectForwardMatches(Case(MakeProblem({}, {}), 1));
  ExpectForwardMatches(Case(MakeProblem({0, 0}, {0, 0}), 1));
  ExpectForwardMatches(Case(MakeProblem({0, 0}, {4, 2}), 1));

  // Empty tensors may come without data pointers.
  ForwardParams params;
  params.shape.num_heads = params.shape.num_heads_k = params.shape.head_dim = 1;
  params.options.softmax_scale = 1.0f;
  EXPECT_TRUE(reference::Forward(params, {}).ok);
}

TEST(ReferenceForward, CausalIsBottomRightAligned) {
  for (const auto& [sq, sk] : {std::pair{4, 9}, std::pair{9, 4}, std::pair{7, 7}}) {
    Problem p = MakeProblem({sq}, {sk});
    p.options.causal = true;
    const Case c(p, 2);
    const ForwardResult r = ExpectForwardMatches(c);
    // Row i sees keys j <= i + sk - sq; rows with i < sq - sk see none.
    const std::vector<double> lse = r.lse.ToDoubles();
    for (int i = 0; i < sq; ++i) {
      EXPECT_EQ(std::isinf(lse[i]), i < sq - sk) << sq << "x" << sk << " row " << i;
    }
  }
}

TEST(ReferenceForward, HeadDims) {
  for (int head_dim : {1, 3, 64, 256}) {
    Problem p = MakeProblem({5, 17}, {9, 17}, 2, 2, head_dim);
    p.options.causal = head_dim % 2 == 1;
    ExpectForwardMatches(Case(p, head_dim));
  }
}

TEST(ReferenceForward, GroupedAndMultiQueryHeads) {
  for (const auto& [heads, heads_k] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{8, 2},
                                       std::pair{8, 1}}) {
    ExpectForwardMatches(Case(MakeProblem({6, 11}, {13, 11}, heads, heads_k), heads + heads_k));
  }
}

TEST(ReferenceForward, SlidingWindows) {
  struct Window {
    int left, right;
    bool causal;
  };
  for (const Window& w : {Window{3, -1, false}, Window{-1, 2, false}, Window{2, 1, false},
                          Window{4, -1, true}, Window{0, 0, false}, Window{2, 5, true}}) {
    for (const auto& [sq, sk] : {std::pair{12, 12}, std::pair{5, 14}, std::pair{14, 5}}) {
      Problem p = MakeProblem({sq}, {sk});
      p.options.window_left = w.left;
      p.options.window_right = w.right;
      p.options.causal = w.causal;
      ExpectForwardMatches(Case(p, 3));
    }
  }
}

TEST(ReferenceForward, WindowThatHidesRowsGivesZeroAndInfiniteLse) {
  // sq = 8, sk = 2, window [0, 0]: row i sees only key i - 6, so rows 0..5 see nothing.
  Problem p = MakeProblem({8}, {2}, 1, 1, 4);
  p.options.window_left = 0;
  p.options.window_right = 0;
  const Case c(p, 4);
  const ForwardResult r = ExpectForwardMatches(c);
  const std::vector<double> out = r.out.ToDoubles();
  const std::vector<double> lse = r.lse.ToDoubles();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(std::isinf(lse[i]), i < 6);
    if (i >= 6) continue;
    for (int d = 0; d < 4; ++d) EXPECT_EQ(out[i * 4 + d], 0.0);
  }
}

TEST(ReferenceForward, SoftcapAndCustomScale) {
  Problem p = MakeProblem({9, 20}, {9, 31}, 4, 2, 24);
  p.options.softcap = 2.0f;
  ExpectForwardMatches(Case(p, 5));
  p.options.softcap = 0.0f;
  p.options.softmax_scale = 0.7f;
  ExpectForwardMatches(Case(p, 5));
  p.options.softcap = 0.5f;
  p.options.causal = true;
  ExpectForwardMatches(Case(p, 5));
}

TEST(ReferenceForward, ZeroScaleMeansInverseSqrtHeadDim) {
  const Case c(MakeProblem({7}, {9}, 2, 1, 12), 6);
  const ForwardResult resolved = RunForward(c);
  ForwardParams params;
  params.shape = c.shape();
  params.options = c.options();
  params.options.softmax_scale = 0.0f;
  params.q = c.q.data();
  params.k = c.k.data();
  params.v = c.v.data();
  Tensor out(c.problem.dtype, c.q_elements());
  Tensor lse(DType::kFloat32, c.total_q * c.problem.num_heads);
  params.out = out.data();
  params.lse = static_cast<float*>(lse.data());
  const KernelStatus status = reference::Forward(params, {});
  ASSERT_TRUE(status.ok) << status.message;
  EXPECT_EQ(out.Bytes(), resolved.out.Bytes());
  EXPECT_EQ(lse.Bytes(), resolved.lse.Bytes());
}

TEST(ReferenceForward, ThreadCountsGiveIdenticalResults) {
  Problem p = MakeProblem({33, 0, 70, 5}, {40, 3, 64, 9}, 6, 3, 20);
  p.options.causal = true;
  const Case c(p, 8);
  const ForwardResult single = ExpectForwardMatches(c, 1);
  for (int threads : {3, 64}) {
    const ForwardResult multi = ExpectForwardMatches(c, threads);
    EXPECT_EQ(multi.out.Bytes(), single.out.Bytes()) << threads << " threads";
    EXPECT_EQ(multi.lse.Bytes(), single.lse.Bytes()) << threads << " threads";
  }
}

}  // namespace
}  // namespace attnserve::kernels::test
