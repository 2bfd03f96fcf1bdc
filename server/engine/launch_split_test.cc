#include "server/engine/launch_split.h"

#include <gtest/gtest.h>

#include "server/engine/group_launch.h"

#include <algorithm>
#include <string>

namespace attnserve::engine {
namespace {

// Rates that make the arithmetic plain: a score costs heads·(4·head_dim/flops + 1/scores)
// = 1·(4·1/4e9 + 1/1e9) = 2 ns, and nothing crosses a host link.
SplitRequest Request(Direction direction, const std::vector<int32_t>& cu_q,
                     const std::vector<int32_t>& cu_k, RequestOptions options = {}) {
  SplitRequest r;
  r.direction = direction;
  r.cu_seqlens_q = &cu_q;
  r.cu_seqlens_k = &cu_k;
  r.options = options;
  r.heads = 1;
  r.head_dim = 1;
  r.rate = {4e9, 1e9, 0};
  return r;
}
constexpr double kSecondsPerScore = 2e-9;

std::vector<int32_t> Offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

// The keys [first, last] row `row` of a (len_q, len_k) sequence sees under the kernels'
// bottom-right alignment (attention_params.h): causal forces window_right 0; -1 is unbounded.
struct Keys {
  int64_t first, last;
  bool empty() const { return last < first; }
};
Keys VisibleRange(bool causal, int window_left, int window_right, int64_t len_q, int64_t len_k,
                  int64_t row) {
  const int64_t diagonal = row + len_k - len_q;
  Keys keys{0, len_k - 1};
  if (causal) window_right = 0;
  if (window_right >= 0) keys.last = std::min(keys.last, diagonal + window_right);
  if (window_left >= 0) keys.first = std::max(keys.first, diagonal - window_left);
  return keys;
}

TEST(LaunchSplitTest, RequestUnderTheSliceIsOneLaunch) {
  const std::vector<int32_t> cu = Offsets({1000, 1000});
  // 2·10⁶ scores: 4 ms.
  EXPECT_TRUE(PlanLaunchSplit(Request(Direction::kForward, cu, cu), 0.005).empty());
  EXPECT_FALSE(PlanLaunchSplit(Request(Direction::kForward, cu, cu), 0.003).empty());
}

TEST(LaunchSplitTest, ZeroSliceNeverSplits) {
  const std::vector<int32_t> cu = Offsets({100000});
  EXPECT_TRUE(PlanLaunchSplit(Request(Direction::kForward, cu, cu), 0).empty());
}

TEST(LaunchSplitTest, SequencesGroupWholeUpToTheSlice) {
  // Ten sequences of 1000 (2 ms each) and one of 10 in a slice of 5 ms: two per launch, the
  // short one riding along with its neighbours.
  std::vector<int32_t> lengths(10, 1000);
  lengths.insert(lengths.begin() + 3, 10);
  const std::vector<int32_t> cu = Offsets(lengths);
  for (Direction direction : {Direction::kForward, Direction::kBackward}) {
    const double factor = direction == Direction::kForward ? 1 : 2.5;
    const std::vector<LaunchRange> ranges =
        PlanLaunchSplit(Request(direction, cu, cu), 0.005 * factor);
    ASSERT_EQ(ranges.size(), 5u);
    int32_t next = 0;
    for (const LaunchRange& range : ranges) {
      EXPECT_FALSE(range.row_block);
      EXPECT_EQ(range.first_sequence, next);
      EXPECT_GT(range.end_sequence, range.first_sequence);
      double seconds = 0;
      for (int32_t b = range.first_sequence; b < range.end_sequence; ++b) {
        seconds += factor * kSecondsPerScore * lengths[b] * lengths[b];
      }
      EXPECT_LE(seconds, 0.005 * factor);
      next = range.end_sequence;
    }
    EXPECT_EQ(next, 11);
    EXPECT_EQ(ranges[1].first_sequence, 2);
    EXPECT_EQ(ranges[1].end_sequence, 5);
  }
}

TEST(LaunchSplitTest, LongBackwardSequenceRunsInOrderedBlocksOfRows) {
  // 20,000² scores at 2.5× the forward's cost = 2 s; blocks of about 0.1 s.
  const std::vector<int32_t> cu = Offsets({20000});
  const std::vector<LaunchRange> alone =
      PlanLaunchSplit(Request(Direction::kBackward, cu, cu), 0.1);
  ASSERT_GE(alone.size(), 20u);
  int64_t row = 0;
  for (const LaunchRange& r : alone) {
    ASSERT_TRUE(r.row_block);
    EXPECT_EQ(r.first_sequence, 0);
    EXPECT_EQ(r.end_sequence, 1);
    // First rows first: the order the engine sums the blocks' dk and dv in.
    EXPECT_EQ(r.row_begin, row);
    EXPECT_EQ(r.row_begin % kRowBlockAlignment, 0);
    EXPECT_EQ(r.key_end, 20000);  // no mask: every key
    EXPECT_LE(2.5 * kSecondsPerScore * (r.row_end - r.row_begin) * 20000, 0.1);
    row = r.row_end;
  }
  EXPECT_EQ(row, 20000);
  // The same plan every time (a deterministic backward depends on it).
  const std::vector<LaunchRange> again =
      PlanLaunchSplit(Request(Direction::kBackward, cu, cu), 0.1);
  ASSERT_EQ(again.size(), alone.size());
  for (size_t i = 0; i < again.size(); ++i) {
    EXPECT_EQ(again[i].row_begin, alone[i].row_begin);
    EXPECT_EQ(again[i].row_end, alone[i].row_end);
  }
  // Beside others, its neighbours stay whole sequences.
  const std::vector<int32_t> three = Offsets({1000, 20000, 1000});
  const std::vector<LaunchRange> ranges =
      PlanLaunchSplit(Request(Direction::kBackward, three, three), 0.1);
  ASSERT_GE(ranges.size(), 22u);
  EXPECT_FALSE(ranges.front().row_block);
  EXPECT_EQ(ranges.front().end_sequence, 1);
  EXPECT_FALSE(ranges.back().row_block);
  EXPECT_EQ(ranges.back().first_sequence, 2);
  for (size_t i = 1; i + 1 < ranges.size(); ++i) {
    EXPECT_TRUE(ranges[i].row_block);
    EXPECT_EQ(ranges[i].first_sequence, 1);
  }
}

TEST(LaunchSplitTest, DropoutOrAlibiKeepsLongSequencesWhole) {
  const std::vector<int32_t> cu = Offsets({1000, 20000, 1000});
  RequestOptions dropout;
  dropout.dropout_p = 0.1f;
  RequestOptions alibi;
  alibi.alibi_slopes = OwnedTensor{};
  for (Direction direction : {Direction::kForward, Direction::kBackward}) {
    for (const RequestOptions* options : {&dropout, &alibi}) {
      const std::vector<LaunchRange> ranges =
          PlanLaunchSplit(Request(direction, cu, cu, *options), 0.001);
      ASSERT_EQ(ranges.size(), 3u);
      for (const LaunchRange& r : ranges) EXPECT_FALSE(r.row_block);
      EXPECT_EQ(ranges[1].first_sequence, 1);
      EXPECT_EQ(ranges[1].end_sequence, 2);
    }
  }
}

TEST(LaunchSplitTest, LongForwardSequenceRunsInAlignedBlocksOfRows) {
  // 20,000² scores = 0.8 s; blocks of about 0.1 s, cut at multiples of 768 rows.
  const std::vector<int32_t> cu = Offsets({500, 20000, 500});
  const std::vector<LaunchRange> ranges =
      PlanLaunchSplit(Request(Direction::kForward, cu, cu), 0.1);
  ASSERT_GE(ranges.size(), 9u);
  EXPECT_FALSE(ranges.front().row_block);
  EXPECT_EQ(ranges.front().end_sequence, 1);
  EXPECT_FALSE(ranges.back().row_block);
  EXPECT_EQ(ranges.back().first_sequence, 2);
  int64_t row = 0;
  for (size_t i = 1; i + 1 < ranges.size(); ++i) {
    const LaunchRange& r = ranges[i];
    ASSERT_TRUE(r.row_block);
    EXPECT_EQ(r.first_sequence, 1);
    EXPECT_EQ(r.row_begin, row);
    EXPECT_EQ(r.row_begin % kRowBlockAlignment, 0);
    EXPECT_EQ(r.key_end, 20000);  // no mask: every key
    EXPECT_LE(kSecondsPerScore * (r.row_end - r.row_begin) * 20000, 0.1);
    row = r.row_end;
  }
  EXPECT_EQ(row, 20000);
}

// Every configuration's blocks cover the rows once, and each row sees the same keys in its
// block's launch (block coordinates, shifted window) as in the whole sequence's.
TEST(LaunchSplitTest, BlocksKeepEveryRowsKeys) {
  struct Case {
    bool causal;
    int window_left, window_right;
    int32_t len_q, len_k;
  };
  const Case cases[] = {
      {true, -1, -1, 10000, 10000},  {true, -1, -1, 6000, 10000},
      {true, -1, -1, 10000, 4000},   {false, 500, 0, 10000, 10000},
      {false, 500, 300, 10000, 9000}, {false, -1, 2000, 8000, 10000},
      {false, 700, -1, 10000, 10000}, {false, 100, 100, 9000, 3000},
      {true, 1000, -1, 9000, 9500},  {false, -1, -1, 5000, 3000},
  };
  for (const Case& c : cases) {
    for (Direction direction : {Direction::kForward, Direction::kBackward}) {
      const std::string name = testing::PrintToString(std::vector<int>{
          direction == Direction::kBackward, c.causal, c.window_left, c.window_right, c.len_q,
          c.len_k});
      RequestOptions options;
      options.causal = c.causal;
      if (c.window_left >= 0) options.window_left = c.window_left;
      if (c.window_right >= 0) options.window_right = c.window_right;
      const std::vector<int32_t> cu_q = Offsets({c.len_q}), cu_k = Offsets({c.len_k});
      // About a fifth of the sequence's work per slice.
      double work = 0;
      for (int64_t row = 0; row < c.len_q; ++row) {
        const Keys keys = VisibleRange(c.causal, c.window_left, c.window_right, c.len_q, c.len_k,
                                       row);
        if (!keys.empty()) work += static_cast<double>(keys.last - keys.first + 1);
      }
      const std::vector<LaunchRange> ranges =
          PlanLaunchSplit(Request(direction, cu_q, cu_k, options),
                          work * kSecondsPerScore / 5 *
                              (direction == Direction::kForward ? 1 : kBackwardWorkFactor));
      ASSERT_GE(ranges.size(), 2u) << name;
      int64_t next = 0;
      for (const LaunchRange& r : ranges) {
        ASSERT_TRUE(r.row_block) << name;
        EXPECT_EQ(r.row_begin, next) << name;
        EXPECT_EQ(r.row_begin % kRowBlockAlignment, 0) << name;
        EXPECT_GT(r.key_end, 0) << name;
        EXPECT_LE(r.key_end, c.len_k) << name;
        next = r.row_end;
        int window_left = c.window_left, window_right = c.window_right;
        ShiftWindow(r.window_shift, &window_left, &window_right);
        EXPECT_GE(window_right, c.window_right >= 0 ? 0 : -1) << name;
        for (int64_t row = r.row_begin; row < r.row_end; ++row) {
          const Keys whole = VisibleRange(c.causal, c.window_left, c.window_right, c.len_q,
                                          c.len_k, row);
          Keys block = VisibleRange(c.causal, window_left, window_right, r.row_end - r.row_begin,
                                    r.key_end, row - r.row_begin);
          if (whole.empty()) {
            EXPECT_TRUE(block.empty()) << name << " row " << row;
            continue;
          }
          ASSERT_EQ(block.first, whole.first) << name << " row " << row;
          ASSERT_EQ(block.last, whole.last) << name << " row " << row;
        }
      }
      EXPECT_EQ(next, c.len_q) << name;
    }
  }
}

TEST(LaunchSplitTest, ArrivalGroupsAreCutWhereTheyExceedTheSlice) {
  // Groups [0,2) [2,3) [3,5): the middle one is one long forward sequence, the others fit.
  const std::vector<int32_t> cu = Offsets({100, 100, 20000, 100, 100});
  const SplitRequest request = Request(Direction::kForward, cu, cu);
  const SequenceGroups groups({2, 3, 5}, absl::InfiniteFuture(), nullptr, nullptr);
  const GroupPieces pieces = CutGroups(groups, [&](int32_t first, int32_t end) {
    return PlanLaunchSplit(request, 0.1, first, end);
  });
  ASSERT_GE(pieces.ranges.size(), 5u);
  ASSERT_EQ(pieces.group_of.size(), pieces.ranges.size());
  EXPECT_EQ(pieces.group_of.front(), 0);
  EXPECT_EQ(pieces.ranges.front().end_sequence, 2);
  EXPECT_EQ(pieces.group_of.back(), 2);
  EXPECT_EQ(pieces.ranges.back().first_sequence, 3);
  for (size_t i = 1; i + 1 < pieces.ranges.size(); ++i) {
    EXPECT_EQ(pieces.group_of[i], 1);
    EXPECT_TRUE(pieces.ranges[i].row_block);
  }
  // No cut: a launch per group, as before.
  const GroupPieces whole = CutGroups(groups, nullptr);
  ASSERT_EQ(whole.ranges.size(), 3u);
  EXPECT_EQ(whole.group_of, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(whole.ranges[1].first_sequence, 2);
  EXPECT_EQ(whole.ranges[1].end_sequence, 3);
}

}  // namespace
}  // namespace attnserve::engine
