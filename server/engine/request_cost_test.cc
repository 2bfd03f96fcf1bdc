#include "server/engine/request_cost.h"

#include "gtest/gtest.h"
#include "kernels/kernel_families.h"

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

TEST(RequestCostTest, ScoreWorkCountsTheKeysEachQueryRowSees) {
  ForwardInputs in;
  in.q.shape = {7, 3, 1};  // 3 heads, head_dim 1: FLOPs say nothing here
  in.cu_seqlens_q = {0, 3, 7};
  in.cu_seqlens_k = {0, 5, 9};
  // Unmasked: 3·5 + 4·4 = 31 pairs per head.
  EXPECT_DOUBLE_EQ(ScoreWork(in), 31.0 * 3);
  // Causal, bottom-right aligned: rows of the first sequence see 3, 4, 5 keys, of the second
  // 1, 2, 3, 4: 22 pairs (the FLOP convention's halving would say 15.5).
  in.options.causal = true;
  EXPECT_DOUBLE_EQ(ScoreWork(in), 22.0 * 3);
  // A window of one key left of the diagonal and none right: 2, 2, 2 and 1, 2, 2, 2.
  in.options.window_left = 1;
  EXPECT_DOUBLE_EQ(ScoreWork(in), 13.0 * 3);
  // Unbounded left (-1), two keys right, not causal: the first sequence's rows (diagonal 2, 3,
  // 4) see 5, 5, 5; the second's (0, 1, 2, 3) see 3, 4, 4, 4.
  in.options.causal = false;
  in.options.window_left = -1;
  in.options.window_right = 2;
  EXPECT_DOUBLE_EQ(ScoreWork(in), 30.0 * 3);
  // A query row with no visible key costs nothing: more queries than keys, causal.
  ForwardInputs tall;
  tall.q.shape = {4, 1, 8};
  tall.cu_seqlens_q = {0, 4};
  tall.cu_seqlens_k = {0, 2};
  tall.options.causal = true;
  EXPECT_DOUBLE_EQ(ScoreWork(tall), 0 + 0 + 1 + 2);
}

TEST(RequestCostTest, ABackwardCostsTwoAndAHalfForwardsAndItsProfileSaysSo) {
  BackwardInputs grad;
  grad.q = {DType::kFloat32, {32768, 1, 1}, nullptr, 32768 * 4};
  grad.k = grad.v = grad.dout = grad.out = grad.q;
  grad.lse = {DType::kFloat32, {1, 32768}, nullptr, 32768 * 4};
  grad.cu_seqlens_q = grad.cu_seqlens_k = {0, 32768};
  const RequestProfile profile = ProfileOf(grad);
  EXPECT_EQ(profile.direction, Direction::kBackward);
  EXPECT_EQ(profile.head_dim, 1);
  EXPECT_DOUBLE_EQ(profile.scores, 2.5 * 32768.0 * 32768);
  EXPECT_DOUBLE_EQ(profile.flops, 2.5 * 4 * 32768.0 * 32768);
  EXPECT_EQ(profile.device_bytes, DeviceBytes(grad));
}

// The flash backward's workspace (kernels/flash/flash_attention.h): D, and unless deterministic
// a float32 dQ accumulator, at least total_q x heads x head_dim floats.
TEST(RequestCostTest, AnAtomicFlashBackwardsProfileCarriesItsDqAccumulator) {
  if (kernels::FindKernelFamily("flash") == nullptr) GTEST_SKIP() << "flash is not built";
  BackwardInputs grad;
  grad.q = {DType::kBFloat16, {300, 8, 128}, nullptr, 300 * 8 * 128 * 2};
  grad.k = grad.v = {DType::kBFloat16, {500, 2, 128}, nullptr, 500 * 2 * 128 * 2};
  grad.dout = grad.out = grad.q;
  grad.lse = {DType::kFloat32, {8, 300}, nullptr, 8 * 300 * 4};
  grad.cu_seqlens_q = {0, 100, 300};
  grad.cu_seqlens_k = {0, 200, 500};
  const int64_t atomic = ProfileOf(grad).WorkspaceBytes("flash");
  grad.deterministic = true;
  const int64_t deterministic = ProfileOf(grad).WorkspaceBytes("flash");
  EXPECT_GE(deterministic, 300 * 8 * 4);  // D
  EXPECT_GE(atomic - deterministic, 300 * 8 * 128 * 4);
  EXPECT_EQ(ProfileOf(grad).WorkspaceBytes("reference"), 0);
  EXPECT_EQ(ProfileOf(grad).WorkspaceBytes("no such family"), 0);
}

}  // namespace
}  // namespace attnserve::engine
