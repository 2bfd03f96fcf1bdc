#include "tools/workload.h"

#include "attnserve/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::load {
namespace {

using ::testing::HasSubstr;

// The mask's definition, one pair at a time.
int64_t BruteForcePairs(int sq, int sk, bool causal) {
  int64_t pairs = 0;
  for (int i = 0; i < sq; ++i) {
    for (int j = 0; j < sk; ++j) pairs += !causal || j <= i + sk - sq;
  }
  return pairs;
}

TEST(FlopsTest, VisiblePairsMatchTheMask) {
  EXPECT_EQ(VisiblePairs(512, 512, false), 512 * 512);
  EXPECT_EQ(VisiblePairs(512, 512, true), 512 * 513 / 2);
  EXPECT_EQ(VisiblePairs(4, 2, true), 3);  // two rows see nothing
  EXPECT_EQ(VisiblePairs(2, 4, true), 7);
  for (int sq = 1; sq <= 9; ++sq) {
    for (int sk = 1; sk <= 9; ++sk) {
      for (bool causal : {false, true}) {
        EXPECT_EQ(VisiblePairs(sq, sk, causal), BruteForcePairs(sq, sk, causal))
            << sq << "x" << sk << " causal " << causal;
      }
    }
  }
}

TEST(FlopsTest, ForwardFlopsSumOverSequences) {
  const double per_pair = 4.0 * 128 * 16;
  EXPECT_DOUBLE_EQ(ForwardFlops({0, 512}, {0, 512}, 16, 128, false), per_pair * 512 * 512);
  EXPECT_DOUBLE_EQ(ForwardFlops({0, 512}, {0, 512}, 16, 128, true), per_pair * 512 * 513 / 2);
  EXPECT_DOUBLE_EQ(ForwardFlops({0, 3, 10}, {0, 5, 6}, 1, 1, false), 4.0 * (3 * 5 + 7 * 1));
  EXPECT_DOUBLE_EQ(ForwardFlops({0}, {0}, 16, 128, false), 0);
  EXPECT_DOUBLE_EQ(kBackwardFlopFactor, 2.5);
}

TEST(WorkloadTest, SampledShapesStayInRangeAndRepeatWithTheSeed) {
  ShapeSpec shape;
  shape.uniform = true;
  shape.batch = {1, 8};
  shape.seqlen_q = {128, 2048};
  shape.seqlen_k = shape.seqlen_q;
  const std::vector<SequenceLengths> a = SampleShapes(shape, 200, 3);
  ASSERT_EQ(a.size(), 200u);
  bool saw_one = false, saw_eight = false;
  for (const SequenceLengths& r : a) {
    ASSERT_GE(r.q.size(), 1u);
    ASSERT_LE(r.q.size(), 8u);
    saw_one |= r.q.size() == 1;
    saw_eight |= r.q.size() == 8;
    EXPECT_EQ(r.q, r.k);  // self-attention unless seqlen_k is given
    for (int32_t len : r.q) {
      EXPECT_GE(len, 128);
      EXPECT_LE(len, 2048);
    }
  }
  EXPECT_TRUE(saw_one && saw_eight);
  EXPECT_EQ(SampleShapes(shape, 200, 3)[17].q, a[17].q);

  shape.separate_k = true;
  shape.seqlen_k = {5, 5};
  for (const SequenceLengths& r : SampleShapes(shape, 10, 1)) {
    EXPECT_THAT(r.k, ::testing::Each(5));
  }
}

TEST(WorkloadTest, SelectRequestsSpreadsOverTheFile) {
  std::vector<SequenceLengths> all(10);
  for (int i = 0; i < 10; ++i) all[i].q = {i + 1};
  const std::vector<SequenceLengths> chosen = SelectRequests(all, 5);
  ASSERT_EQ(chosen.size(), 5u);
  EXPECT_EQ(chosen[0].q[0], 1);
  EXPECT_EQ(chosen[1].q[0], 3);
  EXPECT_EQ(chosen[4].q[0], 9);
  EXPECT_EQ(SelectRequests(all, 50).size(), 10u);
}

class PoolTest : public ::testing::Test {
 protected:
  // Nothing listens there: BuildPool's backward falls back to the local forward.
  void SetUp() override { client_ = *Client::Create("127.0.0.1:1"); }

  std::vector<WorkItem> Build(bool forward, bool backward) {
    WorkloadOptions options;
    options.heads = 4;
    options.heads_k = 2;
    options.head_dim = 16;
    options.dtype = v1::DTYPE_FLOAT32;
    options.causal = true;
    options.forward = forward;
    options.backward = backward;
    options.references = true;
    absl::StatusOr<std::vector<WorkItem>> pool =
        BuildPool({{{7, 3}, {7, 5}}, {{12}, {12}}}, options, *client_);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *std::move(pool) : std::vector<WorkItem>{};
  }

  std::unique_ptr<Client> client_;
};

TEST_F(PoolTest, ForwardItemsCarryTokensFlopsAndVerify) {
  const std::vector<WorkItem> pool = Build(true, false);
  ASSERT_EQ(pool.size(), 2u);
  const WorkItem& item = pool[0];
  EXPECT_EQ(item.tokens, 10);
  EXPECT_EQ(item.backward, nullptr);
  EXPECT_DOUBLE_EQ(item.forward_flops,
                   4.0 * 16 * 4 * (VisiblePairs(7, 7, true) + VisiblePairs(3, 5, true)));
  ASSERT_NE(item.forward, nullptr);
  EXPECT_EQ(item.forward->cu_seqlens_q_size(), 3);

  v1::ForwardResponse response;
  *response.mutable_out() = *MakeTensor(v1::DTYPE_FLOAT32, {10, 4, 16}, item.forward_answer->out);
  *response.mutable_lse() = *MakeTensor(v1::DTYPE_FLOAT32, {4, 10}, item.forward_answer->lse);
  EXPECT_TRUE(VerifyForward(item, response).ok());

  std::vector<float> wrong = item.forward_answer->out;
  wrong[5] += 1.0f;
  *response.mutable_out() = *MakeTensor(v1::DTYPE_FLOAT32, {10, 4, 16}, wrong);
  const absl::Status mismatch = VerifyForward(item, response);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(mismatch.message()), HasSubstr("out: relative error"));

  response.mutable_lse()->mutable_data()->pop_back();
  EXPECT_FALSE(VerifyForward(item, response).ok());
}

TEST_F(PoolTest, BackwardItemsVerifyAgainstTheReferenceGradients) {
  const std::vector<WorkItem> pool = Build(false, true);
  ASSERT_EQ(pool.size(), 2u);
  const WorkItem& item = pool[1];
  EXPECT_EQ(item.forward, nullptr);
  ASSERT_NE(item.backward, nullptr);
  const tools::BackwardAnswer& want = *item.backward_answer;
  v1::BackwardResponse response;
  *response.mutable_dq() = *MakeTensor(v1::DTYPE_FLOAT32, {12, 4, 16}, want.dq);
  *response.mutable_dk() = *MakeTensor(v1::DTYPE_FLOAT32, {12, 2, 16}, want.dk);
  *response.mutable_dv() = *MakeTensor(v1::DTYPE_FLOAT32, {12, 2, 16}, want.dv);
  EXPECT_TRUE(VerifyBackward(item, response).ok());
  *response.mutable_dv() =
      *MakeTensor(v1::DTYPE_FLOAT32, {12, 2, 16}, std::vector<float>(want.dv.size(), 0.0f));
  EXPECT_THAT(std::string(VerifyBackward(item, response).message()), HasSubstr("dv"));
}

}  // namespace
}  // namespace attnserve::load
