// What the reference kernels reject: they report a message instead of crashing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/kernels/attention_test_util.h"
#include "kernels/reference/reference_attention.h"

namespace attnserve::kernels::test {
namespace {

using ::testing::HasSubstr;

Problem SmallProblem() {
  Problem p;
  p.lens_q = {3, 2};
  p.lens_k = {4, 1};
  p.num_heads = 4;
  p.num_heads_k = 2;
  p.head_dim = 8;
  return p;
}

// Forward params over c whose outputs live in `out`/`lse`.
ForwardParams MakeForwardParams(const Case& c, Tensor& out, Tensor& lse) {
  out = Tensor(c.problem.dtype, c.q_elements());
  lse = Tensor(DType::kFloat32, c.total_q * c.problem.num_heads);
  ForwardParams params;
  params.shape = c.shape();
  params.options = c.options();
  params.q = c.q.data();
  params.k = c.k.data();
  params.v = c.v.data();
  params.out = out.data();
  params.lse = static_cast<float*>(lse.data());
  return params;
}

KernelStatus Forward(const ForwardParams& params) {
  ExecutionContext ctx;
  ctx.num_threads = 2;
  return reference::Forward(params, ctx);
}

TEST(ReferenceErrors, NullPointers) {
  const Case c(SmallProblem(), 1);
  Tensor out, lse;
  ForwardParams params = MakeForwardParams(c, out, lse);
  const KernelStatus ok = Forward(params);
  ASSERT_TRUE(ok.ok) << ok.message;

  ForwardParams no_q = params;
  no_q.q = nullptr;
  const KernelStatus status = Forward(no_q);
  EXPECT_FALSE(status.ok);
  EXPECT_THAT(status.message, HasSubstr("q is null"));

  ForwardParams no_lse = params;
  no_lse.lse = nullptr;
  EXPECT_THAT(Forward(no_lse).message, HasSubstr("lse is null"));

  ForwardParams no_offsets = params;
  no_offsets.shape.cu_seqlens_k = nullptr;
  EXPECT_THAT(Forward(no_offsets).message, HasSubstr("cu_seqlens_k is null"));

  BackwardParams backward;
  backward.shape = c.shape();
  backward.options = c.options();
  backward.q = c.q.data();
  backward.k = c.k.data();
  backward.v = c.v.data();
  backward.out = out.data();
  backward.lse = static_cast<const float*>(lse.data());
  backward.dout = nullptr;
  const KernelStatus backward_status = reference::Backward(backward, {});
  EXPECT_FALSE(backward_status.ok);
  EXPECT_THAT(backward_status.message, HasSubstr("dout is null"));
}

TEST(ReferenceErrors, BadShapes) {
  const Case c(SmallProblem(), 2);
  Tensor out, lse;
  const ForwardParams params = MakeForwardParams(c, out, lse);

  ForwardParams ratio = params;
  ratio.shape.num_heads = 3;
  const KernelStatus status = Forward(ratio);
  EXPECT_FALSE(status.ok);
  EXPECT_THAT(status.message, HasSubstr("num_heads (3) must be a multiple of num_heads_k (2)"));

  ForwardParams no_kv_heads = params;
  no_kv_heads.shape.num_heads_k = 0;
  EXPECT_THAT(Forward(no_kv_heads).message, HasSubstr("num_heads_k"));

  ForwardParams zero_dim = params;
  zero_dim.shape.head_dim = 0;
  EXPECT_THAT(Forward(zero_dim).message, HasSubstr("head_dim"));

  ForwardParams negative_batch = params;
  negative_batch.shape.batch = -1;
  EXPECT_THAT(Forward(negative_batch).message, HasSubstr("batch"));
}

TEST(ReferenceErrors, BadOffsets) {
  const Case c(SmallProblem(), 3);
  Tensor out, lse;
  const ForwardParams params = MakeForwardParams(c, out, lse);

  const int32_t decreasing[] = {0, 4, 3};
  ForwardParams p1 = params;
  p1.shape.cu_seqlens_q = decreasing;
  p1.shape.total_q = 3;
  EXPECT_THAT(Forward(p1).message, HasSubstr("cu_seqlens_q decreases"));

  const int32_t short_total[] = {0, 3, 4};
  ForwardParams p2 = params;
  p2.shape.cu_seqlens_q = short_total;
  EXPECT_THAT(Forward(p2).message, HasSubstr("total_q"));

  const int32_t bad_start[] = {1, 4, 5};
  ForwardParams p3 = params;
  p3.shape.cu_seqlens_k = bad_start;
  EXPECT_THAT(Forward(p3).message, HasSubstr("cu_seqlens_k[0]"));

  ForwardParams p4 = params;
  p4.shape.batch = 0;
  EXPECT_THAT(Forward(p4).message, HasSubstr("batch is 0"));
}

}  // namespace
}  // namespace attnserve::kernels::test
