#include "server/transport/data/group_tracker.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace attnserve::transport::data {
namespace {

// A forward of `seqlens` (q and k alike), 1 head of dim 8 in fp32: 32-byte rows.
PlannedCall Forward(const std::vector<int32_t>& seqlens, int64_t chunk_bytes) {
  engine::ForwardInputs in;
  in.cu_seqlens_q = {0};
  for (int32_t n : seqlens) in.cu_seqlens_q.push_back(in.cu_seqlens_q.back() + n);
  in.cu_seqlens_k = in.cu_seqlens_q;
  const int64_t rows = in.cu_seqlens_q.back();
  in.q = in.k = in.v = {kernels::DType::kFloat32, {rows, 1, 8}, nullptr,
                        static_cast<size_t>(rows * 32)};
  PlannedCall call;
  call.inputs = in;
  for (int t = 0; t < 3; ++t) call.slices.push_back({t, t * rows * 32, rows * 32});
  call.payload_bytes = 3 * rows * 32;
  call.chunk_bytes = chunk_bytes;
  return call;
}

TEST(GroupTrackerTest, GroupsSplitTokensEvenlyAtSequenceBoundaries) {
  EXPECT_EQ(GroupEnds(Forward({1 << 19, 1 << 19, 1 << 19, 1 << 19, 1 << 19}, 1 << 20)),
            (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_TRUE(GroupEnds(Forward({1 << 21}, 1 << 20)).empty());   // one sequence
  EXPECT_TRUE(GroupEnds(Forward({100, 100}, 1 << 16)).empty());  // a small payload
}

TEST(GroupTrackerTest, AGroupCompletesWhenEveryChunkOverlappingItArrivedInAnyOrder) {
  // Sequences of 1000 rows (32000 bytes), chunks of 65536 bytes: boundaries fall mid-chunk.
  PlannedCall call = Forward(std::vector<int32_t>(600, 1000), 65536);
  const std::vector<int32_t> ends = GroupEnds(call);
  ASSERT_EQ(ends.size(), 4u);
  GroupTracker tracker(call, ends);
  EXPECT_TRUE(tracker.Empty().empty());
  const int64_t chunks = (call.payload_bytes + 65535) / 65536;
  std::vector<int> completed;
  // Last chunk first, then from the front: group 3 completes last although its tail came first.
  std::vector<int64_t> order = {chunks - 1};
  for (int64_t c = 0; c < chunks - 1; ++c) order.push_back(c);
  std::vector<int> when(4, -1);
  for (size_t i = 0; i < order.size(); ++i) {
    for (int g : tracker.Arrived(order[i] * 65536)) {
      EXPECT_EQ(when[g], -1);
      when[g] = static_cast<int>(i);
    }
  }
  for (int g = 0; g < 4; ++g) EXPECT_GE(when[g], 0) << g;
  // Every group has v rows in the last third: all complete only in the last third of chunks.
  EXPECT_EQ(when[3], static_cast<int>(order.size()) - 1);
  EXPECT_TRUE(std::is_sorted(when.begin(), when.end()));
}

// A backward of `seqlens` as Forward's: dout, q, k, v, out, then lse ([1 head, rows] float32).
PlannedCall Backward(const std::vector<int32_t>& seqlens, int64_t chunk_bytes) {
  const PlannedCall forward = Forward(seqlens, chunk_bytes);
  const auto& f = std::get<engine::ForwardInputs>(forward.inputs);
  engine::BackwardInputs in;
  in.cu_seqlens_q = f.cu_seqlens_q;
  in.cu_seqlens_k = f.cu_seqlens_k;
  in.dout = in.q = in.k = in.v = in.out = f.q;
  const int64_t rows = f.q.shape[0];
  in.lse = {kernels::DType::kFloat32, {1, rows}, nullptr, static_cast<size_t>(rows * 4)};
  PlannedCall call;
  call.inputs = in;
  for (int t = 0; t < 5; ++t) call.slices.push_back({t, t * rows * 32, rows * 32});
  call.slices.push_back({5, 5 * rows * 32, rows * 4});
  call.payload_bytes = 5 * rows * 32 + rows * 4;
  call.chunk_bytes = chunk_bytes;
  return call;
}

// The groups completed, in arrival order of the given chunks.
std::vector<int> Completed(GroupTracker& tracker, const std::vector<int64_t>& chunks,
                           int64_t chunk_bytes) {
  std::vector<int> completed;
  for (int64_t c : chunks) {
    for (int g : tracker.Arrived(c * chunk_bytes)) completed.push_back(g);
  }
  return completed;
}

TEST(GroupTrackerTest, ABackwardsFirstGroupNeedsItsRowsOfEveryTensorAndAllOfLse) {
  // 4 sequences of 2^18 rows: 8 MiB per sequence and tensor, 1 MiB chunks; lse 4 MiB.
  const int64_t mib = 1 << 20;
  PlannedCall call = Backward({1 << 18, 1 << 18, 1 << 18, 1 << 18}, mib);
  const std::vector<int32_t> ends = GroupEnds(call);
  ASSERT_EQ(ends, (std::vector<int32_t>{1, 2, 3, 4}));
  GroupTracker tracker(call, ends);
  std::vector<int64_t> rows0;  // group 0's rows: the first 8 chunks of each 32-chunk tensor
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t c = 0; c < 8; ++c) rows0.push_back(32 * t + c);
  }
  EXPECT_TRUE(Completed(tracker, rows0, mib).empty());  // lse is still missing
  EXPECT_EQ(Completed(tracker, {160, 161, 162, 163}, mib), (std::vector<int>{0}));
}

TEST(GroupTrackerTest, ABackwardOnAContextGroupsByDoutWhenItsOffsetsFit) {
  const int64_t mib = 1 << 20;
  PlannedCall full = Backward({1 << 18, 1 << 18, 1 << 18, 1 << 18}, mib);
  auto& in = std::get<engine::BackwardInputs>(full.inputs);
  in.q = in.k = in.v = in.out = in.lse = {};  // the context's
  full.slices.resize(1);
  full.payload_bytes = full.slices[0].bytes;
  ASSERT_EQ(GroupEnds(full), (std::vector<int32_t>{1, 2, 3, 4}));
  GroupTracker tracker(full, GroupEnds(full));
  EXPECT_EQ(Completed(tracker, {0, 1, 2, 3, 4, 5, 6, 7}, mib), (std::vector<int>{0}));
  // Offsets that do not end at dout's rows (the engine refuses them), or none: run whole.
  PlannedCall bad = full;
  std::get<engine::BackwardInputs>(bad.inputs).cu_seqlens_q.back() += 1;
  EXPECT_TRUE(GroupEnds(bad).empty());
  PlannedCall unsorted = full;
  std::get<engine::BackwardInputs>(unsorted.inputs).cu_seqlens_k[2] = -5;
  EXPECT_TRUE(GroupEnds(unsorted).empty());
  PlannedCall none = full;
  std::get<engine::BackwardInputs>(none.inputs).cu_seqlens_q.clear();
  std::get<engine::BackwardInputs>(none.inputs).cu_seqlens_k.clear();
  EXPECT_TRUE(GroupEnds(none).empty());
}

}  // namespace
}  // namespace attnserve::transport::data
