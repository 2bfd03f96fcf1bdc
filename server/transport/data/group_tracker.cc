#include "server/transport/data/group_tracker.h"

#include <algorithm>

namespace attnserve::transport::data {
namespace {

int64_t RowBytes(const engine::TensorView& t) {
  return t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype);
}

}  // namespace

std::vector<int32_t> GroupEnds(const PlannedCall& call) {
  const auto* forward = std::get_if<engine::ForwardInputs>(&call.inputs);
  if (forward == nullptr) return {};
  return data_channel_wire::GroupEnds(forward->cu_seqlens_q, forward->cu_seqlens_k,
                                      call.payload_bytes);
}

GroupTracker::GroupTracker(const PlannedCall& call, std::vector<int32_t> ends)
    : ends_(std::move(ends)),
      chunk_bytes_(call.chunk_bytes),
      missing_(ends_.size(), 0),
      chunk_groups_(static_cast<size_t>((call.payload_bytes + call.chunk_bytes - 1) /
                                        call.chunk_bytes)) {
  const auto& forward = std::get<engine::ForwardInputs>(call.inputs);
  const engine::TensorView* views[] = {&forward.q, &forward.k, &forward.v};
  for (size_t g = 0; g < ends_.size(); ++g) {
    const int32_t b0 = g == 0 ? 0 : ends_[g - 1], b1 = ends_[g];
    for (const PlannedCall::Slice& slice : call.slices) {
      const std::vector<int32_t>& cu =
          slice.tensor == 0 ? forward.cu_seqlens_q : forward.cu_seqlens_k;
      const int64_t row = RowBytes(*views[slice.tensor]);
      const int64_t begin = slice.offset + cu[b0] * row, end = slice.offset + cu[b1] * row;
      if (end <= begin) continue;
      for (int64_t c = begin / chunk_bytes_; c <= (end - 1) / chunk_bytes_; ++c) {
        std::vector<int>& overlapping = chunk_groups_[c];
        if (!overlapping.empty() && overlapping.back() == static_cast<int>(g)) continue;
        overlapping.push_back(static_cast<int>(g));
        ++missing_[g];
      }
    }
  }
}

std::vector<int> GroupTracker::Empty() const {
  std::vector<int> empty;
  for (size_t g = 0; g < missing_.size(); ++g) {
    if (missing_[g] == 0) empty.push_back(static_cast<int>(g));
  }
  return empty;
}

std::vector<int> GroupTracker::Arrived(uint64_t offset) {
  std::vector<int> completed;
  for (int g : chunk_groups_[offset / static_cast<uint64_t>(chunk_bytes_)]) {
    if (--missing_[g] == 0) completed.push_back(g);
  }
  return completed;
}

}  // namespace attnserve::transport::data
