#include "server/engine/batching.h"

#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/kernel_runner.h"

namespace attnserve::engine {
namespace {

// Owns the bytes behind one random request: several sequences, GQA, bf16.
struct RandomRequest {
  RandomRequest(std::vector<int32_t> seqlens_q, std::vector<int32_t> seqlens_k, uint32_t seed)
      : cu_q{0}, cu_k{0} {
    for (int32_t n : seqlens_q) cu_q.push_back(cu_q.back() + n);
    for (int32_t n : seqlens_k) cu_k.push_back(cu_k.back() + n);
    std::mt19937 rng(seed);
    auto fill = [&](std::string& bytes, int64_t count, int item) {
      bytes.resize(count * item);
      for (char& c : bytes) c = static_cast<char>(rng() % 64);  // finite, varied bf16 values
    };
    const int64_t tq = cu_q.back(), tk = cu_k.back();
    fill(q, tq * kHeads * kDim, 2);
    fill(k, tk * kHeadsK * kDim, 2);
    fill(v, tk * kHeadsK * kDim, 2);
    fill(dout, tq * kHeads * kDim, 2);
  }

  ForwardInputs Forward() const {
    ForwardInputs in;
    in.q = View(q, cu_q.back(), kHeads);
    in.k = View(k, cu_k.back(), kHeadsK);
    in.v = View(v, cu_k.back(), kHeadsK);
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    in.options.causal = true;
    in.options.softcap = 10;
    return in;
  }

  BackwardInputs Backward(const ForwardResult& forward) const {
    BackwardInputs in;
    const ForwardInputs f = Forward();
    in.q = f.q;
    in.k = f.k;
    in.v = f.v;
    in.dout = View(dout, cu_q.back(), kHeads);
    in.out = {f.q.dtype, forward.out.shape, forward.out.data.data(), forward.out.data.size()};
    in.lse = {DType::kFloat32, forward.lse.shape, forward.lse.data.data(), forward.lse.data.size()};
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    in.options = f.options;
    return in;
  }

  static TensorView View(const std::string& bytes, int64_t rows, int64_t heads) {
    return {DType::kBFloat16, {rows, heads, kDim}, bytes.data(), bytes.size()};
  }

  static constexpr int64_t kHeads = 4, kHeadsK = 2, kDim = 16;
  std::vector<int32_t> cu_q, cu_k;
  std::string q, k, v, dout;
};

TEST(BatchingTest, MergedForwardAndBackwardEqualSeparateRunsBitForBit) {
  const std::vector<RandomRequest> requests = {
      {{5, 0, 17}, {9, 3, 17}, 1}, {{12}, {4}, 2}, {{0}, {0}, 3}, {{1, 30}, {30, 1}, 4}};
  std::vector<const ForwardInputs*> forward_parts;
  std::vector<ForwardInputs> forward_inputs;
  for (const auto& r : requests) forward_inputs.push_back(r.Forward());
  for (const auto& in : forward_inputs) forward_parts.push_back(&in);

  const MergedForward merged = MergeForward(forward_parts);
  EXPECT_EQ(merged.inputs.cu_seqlens_q, (std::vector<int32_t>{0, 5, 5, 22, 34, 34, 35, 65}));
  EXPECT_EQ(merged.inputs.cu_seqlens_k, (std::vector<int32_t>{0, 9, 12, 29, 33, 33, 63, 64}));
  auto merged_forward = RunForward(kReferenceFamily, merged.inputs, {});
  ASSERT_TRUE(merged_forward.ok());
  std::vector<ForwardResult> shares = SplitForward(*merged_forward, merged.layout);
  ASSERT_EQ(shares.size(), requests.size());

  std::vector<BackwardInputs> backward_inputs;
  std::vector<ForwardResult> alone_forward;
  for (size_t i = 0; i < requests.size(); ++i) {
    alone_forward.push_back(*RunForward(kReferenceFamily, forward_inputs[i], {}));
    EXPECT_EQ(shares[i].out.shape, alone_forward[i].out.shape);
    EXPECT_EQ(shares[i].out.data, alone_forward[i].out.data) << i;
    EXPECT_EQ(shares[i].lse.shape, alone_forward[i].lse.shape);
    EXPECT_EQ(shares[i].lse.data, alone_forward[i].lse.data) << i;
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    backward_inputs.push_back(requests[i].Backward(alone_forward[i]));
  }
  std::vector<const BackwardInputs*> backward_parts;
  for (const auto& in : backward_inputs) backward_parts.push_back(&in);
  const MergedBackward merged_backward = MergeBackward(backward_parts);
  auto merged_grads = RunBackward(kReferenceFamily, merged_backward.inputs, {});
  ASSERT_TRUE(merged_grads.ok());
  std::vector<BackwardResult> grads = SplitBackward(*merged_grads, merged_backward.layout);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone = RunBackward(kReferenceFamily, backward_inputs[i], {});
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(grads[i].dq.data, alone->dq.data) << i;
    EXPECT_EQ(grads[i].dk.data, alone->dk.data) << i;
    EXPECT_EQ(grads[i].dv.data, alone->dv.data) << i;
    EXPECT_EQ(grads[i].dk.shape, alone->dk.shape) << i;
  }
}

TEST(BatchingTest, CompatibilityNeedsSameShapeClassAndOptions) {
  RandomRequest a({4}, {4}, 1), b({7}, {2}, 2);
  ForwardInputs fa = a.Forward(), fb = b.Forward();
  EXPECT_TRUE(Compatible(fa, fb));  // lengths may differ
  fb.options.causal = false;
  EXPECT_FALSE(Compatible(fa, fb));
  fb = b.Forward();
  fb.options.window_left = 3;
  EXPECT_FALSE(Compatible(fa, fb));
  fb = b.Forward();
  fb.q.dtype = fb.k.dtype = fb.v.dtype = DType::kFloat16;
  EXPECT_FALSE(Compatible(fa, fb));
  fb = b.Forward();
  fb.k.shape[1] = 4;
  EXPECT_FALSE(Compatible(fa, fb));
}

// The dropout mask is keyed by a sequence's index within its request and [batch, heads] ALiBi
// slopes by its row: a merged launch would renumber them, so such requests run alone, even
// beside requests with the very same options.
TEST(BatchingTest, DropoutAndAlibiRequestsRunAlone) {
  RandomRequest a({4}, {4}, 1), b({7}, {2}, 2);
  ForwardInputs fa = a.Forward(), fb = b.Forward();
  fa.options.dropout_p = fb.options.dropout_p = 0.1f;
  fa.options.dropout_seed = fb.options.dropout_seed = 5;
  EXPECT_FALSE(Compatible(fa, fb));
  fa = a.Forward();
  fb = b.Forward();
  OwnedTensor slopes{DType::kFloat32, {fa.q.shape[1]}, std::string(4 * fa.q.shape[1], '\0')};
  fa.options.alibi_slopes = fb.options.alibi_slopes = slopes;
  EXPECT_FALSE(Compatible(fa, fb));
  // Backwards alike (Compatible reads only heads, dtype and options).
  BackwardInputs ba, bb;
  fa = a.Forward();
  fb = b.Forward();
  ba.q = fa.q, ba.k = fa.k, bb.q = fb.q, bb.k = fb.k;
  EXPECT_TRUE(Compatible(ba, bb));
  ba.options.dropout_p = bb.options.dropout_p = 0.1f;
  EXPECT_FALSE(Compatible(ba, bb));
}


TEST(BatchingTest, LsePiecesAndColumnsRoundTripEachPartsLse) {
  // Two parts with 2 heads: lse [2, 3] and [2, 1], values tagging (part, head, row).
  const std::vector<float> lse_a = {0, 1, 2, 10, 11, 12}, lse_b = {100, 110};
  BackwardInputs a, b;
  a.q.shape = {3, 2, 8};
  b.q.shape = {1, 2, 8};
  a.lse = {DType::kFloat32, {2, 3}, reinterpret_cast<const char*>(lse_a.data()), 24};
  b.lse = {DType::kFloat32, {2, 1}, reinterpret_cast<const char*>(lse_b.data()), 8};
  std::string merged;
  for (const Piece& piece : LsePieces({&a, &b})) merged.append(piece.data, piece.size);
  std::vector<float> merged_values(merged.size() / sizeof(float));
  std::memcpy(merged_values.data(), merged.data(), merged.size());
  EXPECT_EQ(merged_values, (std::vector<float>{0, 1, 2, 100, 10, 11, 12, 110}));
  EXPECT_EQ(LseColumnsOf(merged.data(), 2, 4, 0, 3), std::string(a.lse.data, 24));
  EXPECT_EQ(LseColumnsOf(merged.data(), 2, 4, 3, 1), std::string(b.lse.data, 8));
  EXPECT_EQ(RowsOf("abcdefgh", 2, 1, 2), "cdef");
}

}  // namespace
}  // namespace attnserve::engine
