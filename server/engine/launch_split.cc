#include "server/engine/launch_split.h"

#include <algorithm>

#include "server/engine/request_cost.h"

namespace attnserve::engine {
namespace {

// The estimate work_estimate.h makes of a whole request, per piece: each score's share of the
// FLOPs (4·head_dim per query head: the two products) and of the softmax, and each row's bytes
// over the host link. Summed over visible keys, not the FLOP convention's halving for causal,
// so a piece of a masked sequence is priced by what its kernel actually computes.
class PieceCost {
 public:
  PieceCost(const SplitRequest& r, double work_factor) : r_(r) {
    per_score_ = work_factor * static_cast<double>(r.heads) *
                 (4.0 * r.head_dim / r.rate.flops + 1.0 / r.rate.scores);
    if (r.rate.link_bytes > 0) {
      per_query_row_ = r.query_row_bytes / r.rate.link_bytes;
      per_key_row_ = r.key_row_bytes / r.rate.link_bytes;
    }
    const RequestOptions& o = r.options;
    masked_ = o.causal || (o.window_left && *o.window_left >= 0) ||
              (o.window_right && *o.window_right >= 0);
  }

  // Rows [r0, r1) of a (len_q, len_k) sequence, without its keys' bytes.
  double Rows(int64_t len_q, int64_t len_k, int64_t r0, int64_t r1) const {
    double scores = 0;
    if (!masked_) {
      scores = static_cast<double>(r1 - r0) * len_k;
    } else {
      for (int64_t row = r0; row < r1; ++row) {
        scores += static_cast<double>(VisibleKeys(r_.options, len_q, len_k, row));
      }
    }
    return scores * per_score_ + static_cast<double>(r1 - r0) * per_query_row_;
  }
  double Keys(int64_t rows) const { return static_cast<double>(rows) * per_key_row_; }
  double Sequence(int64_t len_q, int64_t len_k) const {
    return Rows(len_q, len_k, 0, len_q) + Keys(len_k);
  }
  // At least Sequence(): every key of every row.
  double Bound(int64_t len_q, int64_t len_k) const {
    return static_cast<double>(len_q) * len_k * per_score_ + len_q * per_query_row_ +
           Keys(len_k);
  }

 private:
  const SplitRequest& r_;
  double per_score_ = 0, per_query_row_ = 0, per_key_row_ = 0;
  bool masked_ = false;
};

// Blocks of rows of sequence `b` (len_q, len_k), each about one slice, appended to `out`.
void AppendRowBlocks(const SplitRequest& r, const PieceCost& cost, int32_t b, int64_t len_q,
                     int64_t len_k, double slice_seconds, std::vector<LaunchRange>& out) {
  const RequestOptions& o = r.options;
  const bool right_bounded = o.causal || (o.window_right && *o.window_right >= 0);
  const int64_t window_right = o.causal ? 0 : (right_bounded ? *o.window_right : -1);
  // The keys rows [.., end) read: up to the last row's diagonal plus window_right.
  const auto key_end = [&](int64_t end) {
    if (!right_bounded) return len_k;
    return std::max<int64_t>(0, std::min(len_k, end + len_k - len_q + window_right));
  };
  const auto emit = [&](int64_t begin, int64_t end) {
    LaunchRange range;
    range.first_sequence = b;
    range.end_sequence = b + 1;
    range.row_block = true;
    range.row_begin = begin;
    range.row_end = end;
    range.key_end = key_end(end);
    // How far past the rows' own bottom-right diagonal (end + len_k − len_q) the block reads.
    range.window_shift = static_cast<int>(range.key_end - (end + len_k - len_q));
    out.push_back(range);
  };
  int64_t begin = 0;
  double block = 0;
  for (int64_t chunk = 0; chunk < len_q; chunk += kRowBlockAlignment) {
    const int64_t chunk_end = std::min(len_q, chunk + kRowBlockAlignment);
    const double seconds = cost.Rows(len_q, len_k, chunk, chunk_end) +
                           cost.Keys(key_end(chunk_end) - key_end(chunk));
    // A block that would read no key at all (the top rows of a causal sequence with more
    // queries than keys) is no launch of its own: it grows until it reads one.
    if (chunk > begin && block + seconds > slice_seconds && key_end(chunk) > 0) {
      emit(begin, chunk);
      begin = chunk;
      block = 0;
    }
    block += seconds;
  }
  emit(begin, len_q);
}

}  // namespace

SplitRequest SplitRequestOf(Direction direction, const TensorView& q,
                            const std::vector<int32_t>& cu_seqlens_q,
                            const std::vector<int32_t>& cu_seqlens_k,
                            const RequestOptions& options, const Throughput& rate) {
  SplitRequest request;
  request.direction = direction;
  request.cu_seqlens_q = &cu_seqlens_q;
  request.cu_seqlens_k = &cu_seqlens_k;
  request.options = options;
  request.heads = q.shape[1];
  request.head_dim = static_cast<int>(q.shape[2]);
  request.rate = rate;
  return request;
}

std::vector<LaunchRange> PlanLaunchSplit(const SplitRequest& r, double slice_seconds) {
  return PlanLaunchSplit(r, slice_seconds, 0, static_cast<int32_t>(r.cu_seqlens_q->size()) - 1);
}

std::vector<LaunchRange> PlanLaunchSplit(const SplitRequest& r, double slice_seconds,
                                         int32_t first, int32_t end) {
  if (!(slice_seconds > 0)) return {};
  const std::vector<int32_t>& cu_q = *r.cu_seqlens_q;
  const std::vector<int32_t>& cu_k = *r.cu_seqlens_k;
  const bool forward = r.direction == Direction::kForward;
  const PieceCost cost(r, forward ? 1.0 : kBackwardWorkFactor);
  // Most requests are far under a slice: a bound in one pass over the offsets says so without
  // pricing rows.
  double bound = 0;
  for (int32_t b = first; b < end; ++b) {
    bound += cost.Bound(cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]);
  }
  if (bound <= slice_seconds) return {};

  std::vector<LaunchRange> ranges;
  LaunchRange group;
  group.first_sequence = first;
  double group_seconds = 0;
  const auto close_group = [&](int32_t at) {
    if (at > group.first_sequence) {
      group.end_sequence = at;
      ranges.push_back(group);
    }
    group = LaunchRange{};
    group.first_sequence = at;
    group_seconds = 0;
  };
  // A row block renumbers its rows from 0 and moves its diagonal by window_shift: the dropout
  // mask (keyed by the row within its sequence) and ALiBi's distances would move with them.
  const bool row_blocks = !r.options.has_dropout() && !r.options.has_alibi();
  for (int32_t b = first; b < end; ++b) {
    const int64_t len_q = cu_q[b + 1] - cu_q[b], len_k = cu_k[b + 1] - cu_k[b];
    const double seconds = cost.Sequence(len_q, len_k);
    if (row_blocks && seconds > slice_seconds && len_q > kRowBlockAlignment) {
      close_group(b);
      AppendRowBlocks(r, cost, b, len_q, len_k, slice_seconds, ranges);
      group.first_sequence = b + 1;
      continue;
    }
    if (b > group.first_sequence && group_seconds + seconds > slice_seconds) close_group(b);
    group_seconds += seconds;
  }
  close_group(end);
  // One launch after all (the bound overestimated a masked request): run it as always.
  if (ranges.size() <= 1) return {};
  return ranges;
}

void ShiftWindow(int window_shift, int* window_left, int* window_right) {
  if (*window_left >= 0) *window_left += window_shift;
  if (*window_right >= 0) *window_right -= window_shift;
}

}  // namespace attnserve::engine
