// Dynamic batching: compatible requests (same dtype, head counts, head_dim and options) run as
// one varlen launch by concatenating their sequences. A varlen kernel treats every sequence
// independently, so each request's rows of the merged answer are exactly its own answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/engine/attention_request.h"

namespace attnserve::engine {

// Whether two requests may share a launch.
bool Compatible(const ForwardInputs& a, const ForwardInputs& b);
bool Compatible(const BackwardInputs& a, const BackwardInputs& b);

// Query and key tokens of a request, for the batch's token budget.
int64_t QueryTokens(const ForwardInputs& in);
int64_t QueryTokens(const BackwardInputs& in);
int64_t KeyTokens(const ForwardInputs& in);
int64_t KeyTokens(const BackwardInputs& in);

// Where each request's rows start in the merged tensors, and the merged offsets.
struct BatchLayout {
  std::vector<int64_t> q_row;  // first query row of request i; q_row.back() = merged total_q
  std::vector<int64_t> k_row;  // first key row of request i; k_row.back() = merged total_k
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
};

template <typename Inputs>
BatchLayout LayOutBatch(const std::vector<const Inputs*>& parts);

// A merged tensor as the byte ranges it concatenates, so a worker can gather the parts straight
// into its own staging buffer instead of merging into a temporary first.
struct Piece {
  const char* data;
  size_t size;
};
// Every part's `member` tensor, in batch order (row-major tensors concatenate by rows).
template <typename Inputs>
std::vector<Piece> RowPieces(const std::vector<const Inputs*>& parts, TensorView Inputs::*member);
// The parts' lse ([num_heads, rows] each) as the merged [num_heads, total_q]: head by head.
std::vector<Piece> LsePieces(const std::vector<const BackwardInputs*>& parts);

// One part's share of a merged output in host memory: rows [first, first + rows) of a row-major
// tensor with `row_bytes` per row, and columns [first, first + count) of an lse of
// [heads, total] floats.
std::string RowsOf(const char* merged, int64_t row_bytes, int64_t first, int64_t rows);
std::string LseColumnsOf(const char* merged, int64_t heads, int64_t total, int64_t first,
                         int64_t count);

// The merged request, owning its concatenated tensor bytes.
struct MergedForward {
  ForwardInputs inputs;  // views into `bytes`
  std::string bytes;
  BatchLayout layout;
};
struct MergedBackward {
  BackwardInputs inputs;
  std::string bytes;
  BatchLayout layout;
};

MergedForward MergeForward(const std::vector<const ForwardInputs*>& parts);
MergedBackward MergeBackward(const std::vector<const BackwardInputs*>& parts);

// Each request's share of the merged answer; execution reports are copied to every part.
std::vector<ForwardResult> SplitForward(const ForwardResult& merged, const BatchLayout& layout);
std::vector<BackwardResult> SplitBackward(const BackwardResult& merged, const BatchLayout& layout);

}  // namespace attnserve::engine
