// Reference backward against float64 analytic gradients and against finite differences of
// L = sum(w o out), plus hidden rows/keys, empty shapes and determinism across thread counts.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/kernels/attention_test_util.h"
#include "kernels/reference/reference_attention.h"

namespace attnserve::kernels::test {
namespace {

// Runs forward then backward and compares dq/dk/dv with the float64 analytic gradients on the
// same rounded inputs and the same (rounded) out.
BackwardResult ExpectBackwardMatches(const Case& c, int num_threads = 0) {
  const ForwardResult forward = RunForward(c, num_threads);
  EXPECT_TRUE(forward.status.ok) << forward.status.message;
  BackwardResult result = RunBackward(c, forward, num_threads);
  EXPECT_TRUE(result.status.ok) << result.status.message;
  const NaiveGradients want =
      NaiveBackward(c.naive(), c.q.ToDoubles(), c.k.ToDoubles(), c.v.ToDoubles(),
                    forward.out.ToDoubles(), c.dout.ToDoubles());
  // As for out, the gradients' own rounding to the dtype dominates the error.
  const double tolerance = OutputTolerance(c.problem.dtype);
  EXPECT_LE(RelativeError(result.dq.ToDoubles(), want.dq), tolerance) << "dq";
  EXPECT_LE(RelativeError(result.dk.ToDoubles(), want.dk), tolerance) << "dk";
  EXPECT_LE(RelativeError(result.dv.ToDoubles(), want.dv), tolerance) << "dv";
  return result;
}

class BackwardDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(BackwardDTypeTest, MatchesFloat64OnRandomShapes) {
  std::mt19937_64 rng(4321 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 40; ++trial) {
    const Problem p = RandomProblem(rng, GetParam());
    SCOPED_TRACE("trial " + std::to_string(trial));
    ExpectBackwardMatches(Case(p, rng()));
  }
}

TEST_P(BackwardDTypeTest, LongCausalSequencesWithGroupedHeads) {
  Problem p = MakeProblem({90, 45}, {130, 45}, 4, 2, 40);
  p.dtype = GetParam();
  p.options.causal = true;
  ExpectBackwardMatches(Case(p, 11));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, BackwardDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const auto& param_info) {
                           return std::string(DTypeName(param_info.param));
                         });

// Central differences of L = sum(w o out) with the float64 forward, for every input element.
NaiveGradients FiniteDifferences(const Case& c, const std::vector<double>& w) {
  const NaiveProblem problem = c.naive();
  std::vector<double> inputs[3] = {c.q.ToDoubles(), c.k.ToDoubles(), c.v.ToDoubles()};
  auto loss = [&] {
    const NaiveForwardResult f = NaiveForward(problem, inputs[0], inputs[1], inputs[2]);
    double sum = 0.0;
    for (size_t i = 0; i < w.size(); ++i) sum += w[i] * f.out[i];
    return sum;
  };
  constexpr double kStep = 1e-6;
  std::vector<double> grads[3];
  for (int t = 0; t < 3; ++t) {
    for (double& x : inputs[t]) {
      const double saved = x;
      x = saved + kStep;
      const double plus = loss();
      x = saved - kStep;
      const double minus = loss();
      x = saved;
      grads[t].push_back((plus - minus) / (2 * kStep));
    }
  }
  return {grads[0], grads[1], grads[2]};
}

TEST(ReferenceBackward, FiniteDifferences) {
  struct Shape {
    const char* name;
    Problem problem;
  };
  std::vector<Shape> shapes;
  shapes.push_back({"plain", MakeProblem({5, 3}, {4, 6}, 1, 1, 4)});
  shapes.push_back({"causal", MakeProblem({6, 3}, {4, 7}, 2, 1, 3)});
  shapes.back().problem.options.causal = true;
  shapes.push_back({"window", MakeProblem({7}, {7}, 2, 2, 4)});
  shapes.back().problem.options.window_left = 2;
  shapes.back().problem.options.window_right = 1;
  shapes.push_back({"softcap", MakeProblem({4, 5}, {6, 5}, 2, 1, 4)});
  shapes.back().problem.options.softcap = 1.0f;
  shapes.push_back({"gqa causal softcap", MakeProblem({5}, {8}, 4, 2, 2)});
  shapes.back().problem.options.causal = true;
  shapes.back().problem.options.softcap = 2.0f;

  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.name);
    Case c(shape.problem, 21);
    // dout doubles as the loss weights w.
    const std::vector<double> w = c.dout.ToDoubles();
    const NaiveGradients fd = FiniteDifferences(c, w);

    // The oracle's analytic gradients agree with finite differences to float64 accuracy ...
    const NaiveForwardResult f =
        NaiveForward(c.naive(), c.q.ToDoubles(), c.k.ToDoubles(), c.v.ToDoubles());
    const NaiveGradients analytic =
        NaiveBackward(c.naive(), c.q.ToDoubles(), c.k.ToDoubles(), c.v.ToDoubles(), f.out, w);
    EXPECT_LE(RelativeError(analytic.dq, fd.dq), 1e-7);
    EXPECT_LE(RelativeError(analytic.dk, fd.dk), 1e-7);
    EXPECT_LE(RelativeError(analytic.dv, fd.dv), 1e-7);

    // ... and so does the float32 kernel, to float32 accuracy.
    const ForwardResult forward = RunForward(c, 3);
    ASSERT_TRUE(forward.status.ok) << forward.status.message;
    const BackwardResult kernel = RunBackward(c, forward, 3);
    ASSERT_TRUE(kernel.status.ok) << kernel.status.message;
    EXPECT_LE(RelativeError(kernel.dq.ToDoubles(), fd.dq), 1e-5);
    EXPECT_LE(RelativeError(kernel.dk.ToDoubles(), fd.dk), 1e-5);
    EXPECT_LE(RelativeError(kernel.dv.ToDoubles(), fd.dv), 1e-5);
  }
}

TEST(ReferenceBackward, HiddenRowsAndKeysGetZeroGradients) {
  // sq = 2, sk = 6, causal with window_left 0: row 0 sees key 4, row 1 sees key 5. Second
  // sequence: sq = 6, sk = 2, causal, so rows 0..3 see nothing.
  Problem p = MakeProblem({2, 6}, {6, 2}, 2, 1, 5);
  p.options.causal = true;
  p.options.window_left = 0;
  const Case c(p, 31);
  const BackwardResult r = ExpectBackwardMatches(c);
  const std::vector<double> dq = r.dq.ToDoubles();
  const std::vector<double> dk = r.dk.ToDoubles();
  const std::vector<double> dv = r.dv.ToDoubles();
  for (int key = 0; key < 4; ++key) {
    for (int d = 0; d < 5; ++d) {
      EXPECT_EQ(dk[key * 5 + d], 0.0) << "key " << key;
      EXPECT_EQ(dv[key * 5 + d], 0.0) << "key " << key;
    }
  }
  for (int row = 2; row < 6; ++row) {
    for (int i = 0; i < 2 * 5; ++i) EXPECT_EQ(dq[row * 2 * 5 + i], 0.0) << "row " << row;
  }
}

TEST(ReferenceBackward, EmptySequencesAndBatchZero) {
  ExpectBackwardMatches(Case(MakeProblem({}, {}), 1));
  ExpectBackwardMatches(Case(MakeProblem({0, 0}, {0, 0}), 1));
  const BackwardResult r = ExpectBackwardMatches(Case(MakeProblem({0, 4, 3}, {5, 0, 3}), 1));
  // Keys of sequence 0 have no queries and queries of sequence 1 no keys: all zero.
  const std::vector<double> dk = r.dk.ToDoubles();
  const std::vector<double> dq = r.dq.ToDoubles();
  for (int i = 0; i < 5 * 16; ++i) EXPECT_EQ(dk[i], 0.0);
  for (int i = 0; i < 4 * 2 * 16; ++i) EXPECT_EQ(dq[i], 0.0);

  BackwardParams params;
  params.shape.num_heads = params.shape.num_heads_k = params.shape.head_dim = 1;
  params.options.softmax_scale = 1.0f;
  EXPECT_TRUE(reference::Backward(params, {}).ok);
}

TEST(ReferenceBackward, HeadDims) {
  for (int head_dim : {1, 3, 64, 256}) {
    Problem p = MakeProblem({5, 17}, {9, 17}, 2, 1, head_dim);
    p.options.causal = head_dim % 2 == 1;
    p.options.softcap = head_dim == 64 ? 3.0f : 0.0f;
    ExpectBackwardMatches(Case(p, head_dim));
  }
}

TEST(ReferenceBackward, DeterministicAcrossThreadCounts) {
  Problem p = MakeProblem({33, 0, 70, 5}, {40, 3, 64, 9}, 8, 2, 20);
  p.options.causal = true;
  p.options.softcap = 4.0f;
  const Case c(p, 41);
  const ForwardResult forward = RunForward(c, 2);
  ASSERT_TRUE(forward.status.ok);
  const BackwardResult single = RunBackward(c, forward, 1);
  ASSERT_TRUE(single.status.ok);
  for (int threads : {3, 64}) {
    ExpectBackwardMatches(c, threads);
    for (bool deterministic : {false, true}) {
      const BackwardResult multi = RunBackward(c, forward, threads, deterministic);
      ASSERT_TRUE(multi.status.ok);
      EXPECT_EQ(multi.dq.Bytes(), single.dq.Bytes()) << threads << " threads";
      EXPECT_EQ(multi.dk.Bytes(), single.dk.Bytes()) << threads << " threads";
      EXPECT_EQ(multi.dv.Bytes(), single.dv.Bytes()) << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace attnserve::kernels::test
