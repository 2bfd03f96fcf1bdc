// Reference forward and backward with dropout and ALiBi: a tiny problem written out by hand,
// then random shapes against the float64 oracle (whose mask is drawn element by element from
// kernels/dropout_mask.h), and launches of a sub-range of sequences (first_sequence).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/dropout_mask.h"
#include "kernels/reference/reference_attention.h"
#include "tests/kernels/attention_test_util.h"

namespace attnserve::kernels::test {
namespace {

// One head, head_dim 1, one query row against 3 keys, scale 1: every step by hand.
TEST(ReferenceDropoutAlibi, TinyProblemByHand) {
  Problem p = MakeProblem({1}, {3}, 1, 1, 1);
  p.options.softmax_scale = 1.0f;
  const float slope = 0.5f;
  p.options.alibi_slopes = &slope;
  p.options.dropout_p = 0.5f;
  // A seed whose mask for (sequence 0, head 0, row 0) keeps some keys and drops others.
  uint64_t seed = 1;
  for (;; ++seed) {
    const Philox4 bits = DropoutBits(seed, 0, 0, 0, 0);
    const uint32_t t = DropoutThreshold(0.5f);
    if ((bits.v[0] >= t) && (bits.v[1] < t) && (bits.v[2] >= t)) break;
  }
  p.options.dropout_seed = seed;
  Case c(p, 1);
  const double q = 0.5, k[3] = {1.0, -2.0, 0.25}, v[3] = {3.0, -1.0, 2.0};
  c.q.Set(0, q);
  for (int j = 0; j < 3; ++j) {
    c.k.Set(j, k[j]);
    c.v.Set(j, v[j]);
  }
  c.dout.Set(0, 1.0);
  // Row 0 of a 1x3 problem sits at diagonal 2: biases -0.5*2, -0.5*1, 0.
  double s[3], sum = 0;
  for (int j = 0; j < 3; ++j) {
    s[j] = q * k[j] - slope * std::abs(2 - j);
    sum += std::exp(s[j]);
  }
  const double lse = std::log(sum);
  const double p0 = std::exp(s[0]) / sum, p2 = std::exp(s[2]) / sum;
  const double out = 2.0 * (p0 * v[0] + p2 * v[2]);  // keys 0 and 2 kept, scaled by 1/(1-0.5)

  const ForwardResult f = RunForward(c);
  ASSERT_TRUE(f.status.ok) << f.status.message;
  EXPECT_NEAR(f.out.ToDoubles()[0], out, 1e-5);
  EXPECT_NEAR(f.lse.ToDoubles()[0], lse, 1e-5);  // the undropped softmax's

  const BackwardResult b = RunBackward(c, f);
  ASSERT_TRUE(b.status.ok) << b.status.message;
  const double probs[3] = {p0, std::exp(s[1]) / sum, p2};
  const double z[3] = {2.0, 0.0, 2.0};
  const double delta = out;  // dout = 1
  double dq = 0;
  for (int j = 0; j < 3; ++j) {
    const double ds = probs[j] * (z[j] * v[j] - delta);
    dq += ds * k[j];
    EXPECT_NEAR(b.dk.ToDoubles()[j], ds * q, 1e-5) << j;
    EXPECT_NEAR(b.dv.ToDoubles()[j], z[j] * probs[j], 1e-5) << j;
  }
  EXPECT_NEAR(b.dq.ToDoubles()[0], dq, 1e-5);
}

struct Variant {
  const char* name;
  float dropout_p;
  bool alibi;
  bool per_sequence_slopes;
};

class DropoutAlibiTest : public ::testing::TestWithParam<Variant> {};

TEST_P(DropoutAlibiTest, MatchesFloat64OnRandomShapes) {
  const Variant variant = GetParam();
  std::mt19937_64 rng(99 + static_cast<int>(variant.dropout_p * 10) + variant.alibi * 7);
  for (int trial = 0; trial < 24; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    Problem p = RandomProblem(rng, trial % 3 == 0 ? DType::kBFloat16 : DType::kFloat32);
    // Causal with window_left 0 lets each row see one key: P = 1, so dS and dq/dk are 0 up to
    // rounding and a relative error means nothing. Widen it.
    if (p.options.window_left == 0) p.options.window_left = 3;
    std::vector<float> slopes;
    if (variant.alibi) {
      const size_t rows = variant.per_sequence_slopes ? p.lens_q.size() : 1;
      std::uniform_real_distribution<float> slope(0.0f, 0.5f);
      for (size_t i = 0; i < rows * p.num_heads; ++i) slopes.push_back(slope(rng));
      p.options.alibi_slopes = slopes.data();
      p.options.alibi_slopes_stride = variant.per_sequence_slopes ? p.num_heads : 0;
    }
    p.options.dropout_p = variant.dropout_p;
    p.options.dropout_seed = rng() | 1;
    const Case c(p, rng());
    const ForwardResult f = RunForward(c);
    ASSERT_TRUE(f.status.ok) << f.status.message;
    const NaiveForwardResult want =
        NaiveForward(c.naive(), c.q.ToDoubles(), c.k.ToDoubles(), c.v.ToDoubles());
    const double tolerance = OutputTolerance(p.dtype);
    EXPECT_LE(RelativeError(f.out.ToDoubles(), want.out), tolerance);
    EXPECT_LE(MaxLseError(f.lse.ToDoubles(), want.lse), 2e-6);
    const BackwardResult b = RunBackward(c, f);
    ASSERT_TRUE(b.status.ok) << b.status.message;
    const NaiveGradients grads = NaiveBackward(c.naive(), c.q.ToDoubles(), c.k.ToDoubles(),
                                               c.v.ToDoubles(), f.out.ToDoubles(),
                                               c.dout.ToDoubles());
    EXPECT_LE(RelativeError(b.dq.ToDoubles(), grads.dq), tolerance) << "dq";
    EXPECT_LE(RelativeError(b.dk.ToDoubles(), grads.dk), tolerance) << "dk";
    EXPECT_LE(RelativeError(b.dv.ToDoubles(), grads.dv), tolerance) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, DropoutAlibiTest,
    ::testing::Values(Variant{"dropout", 0.3f, false, false},
                      Variant{"alibi_per_head", 0.0f, true, false},
                      Variant{"alibi_per_sequence", 0.0f, true, true},
                      Variant{"both", 0.17f, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

// A launch of sequence 1 alone with first_sequence = 1 draws the same mask and slopes as the
// whole request does for it: bitwise the same out, lse and gradients.
TEST(ReferenceDropoutAlibi, FirstSequenceKeysTheMaskAndSlopes) {
  Problem whole = MakeProblem({13, 37}, {21, 37}, 2, 1, 8);
  const float slopes[4] = {0.1f, 0.2f, 0.3f, 0.4f};  // [batch 2, heads 2]
  whole.options.alibi_slopes = slopes;
  whole.options.alibi_slopes_stride = 2;
  whole.options.dropout_p = 0.4f;
  whole.options.dropout_seed = 0xfeedbeef12345ull;
  whole.options.causal = true;
  const Case c(whole, 5);
  const ForwardResult f = RunForward(c);
  ASSERT_TRUE(f.status.ok);
  const BackwardResult b = RunBackward(c, f);
  ASSERT_TRUE(b.status.ok);

  Problem part = MakeProblem({37}, {37}, 2, 1, 8);
  part.options = whole.options;
  part.options.first_sequence = 1;
  Case pc(part, 5);
  const int64_t q0 = 13, k0 = 21, qw = 2 * 8, kw = 8;
  for (int64_t i = 0; i < 37 * qw; ++i) {
    pc.q.Set(i, c.q.ToDoubles()[q0 * qw + i]);
    pc.dout.Set(i, c.dout.ToDoubles()[q0 * qw + i]);
  }
  for (int64_t i = 0; i < 37 * kw; ++i) {
    pc.k.Set(i, c.k.ToDoubles()[k0 * kw + i]);
    pc.v.Set(i, c.v.ToDoubles()[k0 * kw + i]);
  }
  const ForwardResult pf = RunForward(pc);
  ASSERT_TRUE(pf.status.ok);
  const std::vector<double> out = f.out.ToDoubles(), part_out = pf.out.ToDoubles();
  for (int64_t i = 0; i < 37 * qw; ++i) ASSERT_EQ(part_out[i], out[q0 * qw + i]) << i;
  const BackwardResult pb = RunBackward(pc, pf);
  ASSERT_TRUE(pb.status.ok);
  const std::vector<double> dk = b.dk.ToDoubles(), part_dk = pb.dk.ToDoubles();
  for (int64_t i = 0; i < 37 * kw; ++i) ASSERT_EQ(part_dk[i], dk[k0 * kw + i]) << i;

  // And differently from first_sequence = 0, which would be sequence 0's mask and slopes.
  part.options.first_sequence = 0;
  Case other(part, 5);
  other.q = pc.q;
  other.k = pc.k;
  other.v = pc.v;
  const ForwardResult of = RunForward(other);
  ASSERT_TRUE(of.status.ok);
  EXPECT_NE(of.out.ToDoubles(), part_out);
}

}  // namespace
}  // namespace attnserve::kernels::test
