#include "server/transport/data/group_tracker.h"

#include <algorithm>

namespace attnserve::transport::data {
namespace {

using data_channel_wire::GroupRows;

int64_t RowBytes(const engine::TensorView& t) {
  if (t.shape.size() != 3) return 0;
  return t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype);
}

// Offsets from 0, never decreasing, ending at `rows` (rows < 0: any end).
bool Fits(const std::vector<int32_t>& cu, int64_t rows) {
  if (cu.empty() || cu.front() != 0 || !std::is_sorted(cu.begin(), cu.end())) return false;
  return rows < 0 || cu.back() == rows;
}

// The travelling tensors' places in the payload and which rows of them each group needs.
std::vector<data_channel_wire::PayloadTensor> PayloadTensors(const PlannedCall& call) {
  std::vector<const engine::TensorView*> views;
  std::vector<GroupRows> rows;
  if (const auto* f = std::get_if<engine::ForwardInputs>(&call.inputs)) {
    views = {&f->q, &f->k, &f->v};
    rows = {GroupRows::kQuery, GroupRows::kKey, GroupRows::kKey};
  } else {
    const auto& b = std::get<engine::BackwardInputs>(call.inputs);
    views = {&b.dout, &b.q, &b.k, &b.v, &b.out, &b.lse};
    rows = {GroupRows::kQuery, GroupRows::kQuery, GroupRows::kKey,
            GroupRows::kKey,   GroupRows::kQuery, GroupRows::kAllWithFirstGroup};
  }
  std::vector<data_channel_wire::PayloadTensor> tensors;
  for (const PlannedCall::Slice& slice : call.slices) {
    tensors.push_back({slice.offset, slice.bytes, RowBytes(*views[slice.tensor]),
                       rows[slice.tensor]});
  }
  return tensors;
}

}  // namespace

std::vector<int32_t> GroupEnds(const PlannedCall& call) {
  if (const auto* forward = std::get_if<engine::ForwardInputs>(&call.inputs)) {
    return data_channel_wire::GroupEnds(forward->cu_seqlens_q, forward->cu_seqlens_k,
                                        call.payload_bytes);
  }
  const auto& backward = std::get<engine::BackwardInputs>(call.inputs);
  // A full backward passed the engine's validation already; a backward on a context did not
  // (its tensors are the context's), so its offsets are checked against dout here first.
  if (backward.dout.shape.size() != 3 || !Fits(backward.cu_seqlens_q, backward.dout.shape[0]) ||
      !Fits(backward.cu_seqlens_k, -1)) {
    return {};
  }
  return data_channel_wire::GroupEnds(backward.cu_seqlens_q, backward.cu_seqlens_k,
                                      call.payload_bytes);
}

GroupTracker::GroupTracker(const PlannedCall& call, std::vector<int32_t> ends)
    : ends_(std::move(ends)),
      chunk_bytes_(call.chunk_bytes),
      missing_(ends_.size(), 0),
      chunk_groups_(static_cast<size_t>((call.payload_bytes + call.chunk_bytes - 1) /
                                        call.chunk_bytes)) {
  const std::vector<int32_t>& cu_q = std::visit(
      [](const auto& in) -> const std::vector<int32_t>& { return in.cu_seqlens_q; }, call.inputs);
  const std::vector<int32_t>& cu_k = std::visit(
      [](const auto& in) -> const std::vector<int32_t>& { return in.cu_seqlens_k; }, call.inputs);
  const std::vector<data_channel_wire::ByteRanges> ranges =
      data_channel_wire::GroupRanges(PayloadTensors(call), cu_q, cu_k, ends_);
  const int64_t chunks = static_cast<int64_t>(chunk_groups_.size());
  for (size_t g = 0; g < ranges.size(); ++g) {
    for (const auto& [begin, end] : ranges[g]) {
      for (int64_t c = begin / chunk_bytes_; c <= (end - 1) / chunk_bytes_ && c < chunks; ++c) {
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
