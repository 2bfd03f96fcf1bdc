#include "server/engine/request_cost.h"

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

TEST(RequestCostTest, FollowsTheBenchmarkConvention) {
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

TEST(RequestCostTest, DeviceBytesCountInputsOutputsAndScratch) {
  ForwardInputs in;
  in.q = {DType::kBFloat16, {10, 4, 8}, nullptr, 640};
  in.k = in.v = {DType::kBFloat16, {6, 2, 8}, nullptr, 192};
  EXPECT_EQ(DeviceBytes(in), 640 + 192 + 192 + 640 + 4 * 10 * 4);
  BackwardInputs grad;
  grad.q = grad.dout = grad.out = in.q;
  grad.k = grad.v = in.k;
  grad.lse = {DType::kFloat32, {4, 10}, nullptr, 160};
  EXPECT_EQ(DeviceBytes(grad), 3 * 640 + 2 * 192 + 160 + 640 + 2 * 192 + 160);
}

}  // namespace
}  // namespace attnserve::engine
