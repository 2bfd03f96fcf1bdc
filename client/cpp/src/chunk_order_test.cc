#include "client/cpp/src/chunk_order.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace attnserve::data_channel {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Four sequences of 10 rows of 256 KiB per tensor: each tensor 10 MiB, 1 MiB chunks.
v1::DataRequest Forward(std::vector<int32_t> cu) {
  v1::DataRequest request;
  v1::ForwardRequest* f = request.mutable_forward();
  for (v1::Tensor* t : {f->mutable_q(), f->mutable_k(), f->mutable_v()}) {
    t->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : {int64_t{cu.back()}, int64_t{64}, int64_t{1024}}) t->add_shape(d);
  }
  for (int32_t c : cu) {
    f->add_cu_seqlens_q(c);
    f->add_cu_seqlens_k(c);
  }
  request.set_payload_bytes(3 * 256 * 1024 * int64_t{cu.back()});
  request.set_chunk_bytes(kMiB);
  return request;
}

std::vector<uint64_t> InMiB(const std::vector<uint64_t>& offsets) {
  std::vector<uint64_t> mib;
  for (uint64_t o : offsets) mib.push_back(o / kMiB);
  return mib;
}

TEST(ChunkOrder, GroupByGroupAsTheServerSplits) {
  const std::vector<uint64_t> order = InMiB(ChunkOrder(Forward({0, 10, 20, 30, 40}), true));
  ASSERT_EQ(order.size(), 30u);
  EXPECT_EQ(std::vector<uint64_t>(order.begin(), order.begin() + 15),
            (std::vector<uint64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22, 3, 4, 13, 14, 23, 24}));
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t c = 0; c < 30; ++c) EXPECT_EQ(sorted[c], c);
}

TEST(ChunkOrder, PayloadOrderWhenOffOrNotGrouped) {
  std::vector<uint64_t> payload_order;
  for (uint64_t c = 0; c < 30; ++c) payload_order.push_back(c);
  EXPECT_EQ(InMiB(ChunkOrder(Forward({0, 10, 20, 30, 40}), false)), payload_order);
  EXPECT_EQ(InMiB(ChunkOrder(Forward({0, 40}), true)), payload_order);
}

// A full backward over Forward's sequences: dout, q, k, v, out of 10 MiB each, then lse
// ([64 heads, 40 rows] float32: 10 KiB, in the last chunk with out's tail).
v1::DataRequest Backward(std::vector<int32_t> cu) {
  v1::DataRequest request;
  v1::BackwardRequest* b = request.mutable_backward();
  for (v1::Tensor* t : {b->mutable_dout(), b->mutable_q(), b->mutable_k(), b->mutable_v(),
                        b->mutable_out()}) {
    t->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : {int64_t{cu.back()}, int64_t{64}, int64_t{1024}}) t->add_shape(d);
  }
  b->mutable_lse()->set_dtype(v1::DTYPE_FLOAT32);
  b->mutable_lse()->add_shape(64);
  b->mutable_lse()->add_shape(cu.back());
  for (int32_t c : cu) {
    b->add_cu_seqlens_q(c);
    b->add_cu_seqlens_k(c);
  }
  request.set_payload_bytes(5 * 256 * 1024 * int64_t{cu.back()} + 4 * 64 * int64_t{cu.back()});
  request.set_chunk_bytes(kMiB);
  return request;
}

TEST(ChunkOrder, ABackwardGoesByGroupWithAllOfLseInTheFirst) {
  const std::vector<uint64_t> order = InMiB(ChunkOrder(Backward({0, 10, 20, 30, 40}), true));
  ASSERT_EQ(order.size(), 51u);
  // Group 0: the first 2.5 MiB of dout, q, k, v and out, then lse's chunk (chunk 50).
  EXPECT_EQ(std::vector<uint64_t>(order.begin(), order.begin() + 16),
            (std::vector<uint64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42, 50}));
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t c = 0; c < 51; ++c) EXPECT_EQ(sorted[c], c);
}

TEST(GroupEnds, SplitsByQPlusKTokens) {
  const std::vector<int32_t> cu = {0, 100, 200, 300, 400, 500, 600, 700, 800};
  EXPECT_EQ(data_channel_wire::GroupEnds(cu, cu, 32 * kMiB), (std::vector<int32_t>{2, 4, 6, 8}));
  EXPECT_TRUE(data_channel_wire::GroupEnds(cu, cu, 16 * kMiB - 1).empty());
  const std::vector<int32_t> uneven = {0, 700, 710, 800};
  EXPECT_EQ(data_channel_wire::GroupEnds(uneven, uneven, 32 * kMiB), (std::vector<int32_t>{1, 3}));
}

}  // namespace
}  // namespace attnserve::data_channel
