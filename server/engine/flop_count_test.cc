#include "server/engine/flop_count.h"

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

TEST(FlopCountTest, FollowsTheBenchmarkConvention) {
  ForwardInputs in;
  in.q.shape = {30, 16, 128};  // 16 heads, head_dim 128
  in.cu_seqlens_q = {0, 10, 10, 30};
  in.cu_seqlens_k = {0, 5, 7, 47};
  // Σ sq·sk = 10·5 + 0·2 + 20·40 = 850.
  EXPECT_DOUBLE_EQ(AttentionFlops(in), 4.0 * 850 * 16 * 128);
  in.options.causal = true;
  EXPECT_DOUBLE_EQ(AttentionFlops(in), 2.0 * 850 * 16 * 128);
  BackwardInputs grad;
  grad.q = in.q;
  grad.cu_seqlens_q = in.cu_seqlens_q;
  grad.cu_seqlens_k = in.cu_seqlens_k;
  EXPECT_DOUBLE_EQ(AttentionFlops(grad), 2.5 * 4.0 * 850 * 16 * 128);
}

}  // namespace
}  // namespace attnserve::engine
