#include "server/engine/batching.h"

#include <cstring>

namespace attnserve::engine {
namespace {

// Dropout and ALiBi are keyed by a sequence's index within its own request (the mask) and by
// its request's slopes, which a merged launch would renumber and mix: such requests run alone.
bool SameOptions(const RequestOptions& a, const RequestOptions& b) {
  return SameOptionsButSeed(a, b) && !a.has_dropout() && !a.has_alibi();
}

bool SameHeads(const TensorView& qa, const TensorView& ka, const TensorView& qb,
               const TensorView& kb) {
  return qa.dtype == qb.dtype && qa.shape[1] == qb.shape[1] && qa.shape[2] == qb.shape[2] &&
         ka.shape[1] == kb.shape[1];
}

int64_t RowBytes(const TensorView& t) { return t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype); }

int64_t RowBytes(const OwnedTensor& t) {
  int64_t row_bytes = kernels::DTypeSize(t.dtype);
  for (size_t d = 1; d < t.shape.size(); ++d) row_bytes *= t.shape[d];
  return row_bytes;
}

// Appends the pieces to `bytes` and returns a view of the concatenation, shaped like `like`
// with `rows` rows. Views are pointed into `bytes` once it stops growing (PointInto).
TensorView Append(const std::vector<Piece>& pieces, const TensorView& like, int64_t rows,
                  std::string& bytes, std::vector<size_t>& view_offsets) {
  TensorView view = like;
  view.shape[0] = rows;
  view_offsets.push_back(bytes.size());
  for (const Piece& piece : pieces) bytes.append(piece.data, piece.size);
  view.size_bytes = bytes.size() - view_offsets.back();
  return view;
}

void PointInto(std::string& bytes, const std::vector<size_t>& offsets,
               std::initializer_list<TensorView*> views) {
  size_t i = 0;
  for (TensorView* view : views) view->data = bytes.data() + offsets[i++];
}

OwnedTensor SliceRows(const OwnedTensor& t, int64_t first_row, int64_t rows) {
  OwnedTensor slice;
  slice.dtype = t.dtype;
  slice.shape = t.shape;
  slice.shape[0] = rows;
  slice.data = RowsOf(t.data.data(), RowBytes(t), first_row, rows);
  return slice;
}

OwnedTensor SliceLseColumns(const OwnedTensor& lse, int64_t first, int64_t count) {
  OwnedTensor slice;
  slice.dtype = DType::kFloat32;
  slice.shape = {lse.shape[0], count};
  slice.data = LseColumnsOf(lse.data.data(), lse.shape[0], lse.shape[1], first, count);
  return slice;
}

}  // namespace

// One launch runs one route: parts planned for different code paths never share it.
bool Compatible(const ForwardInputs& a, const ForwardInputs& b) {
  return SameHeads(a.q, a.k, b.q, b.k) && SameOptions(a.options, b.options) &&
         a.route == b.route;
}

bool Compatible(const BackwardInputs& a, const BackwardInputs& b) {
  return SameHeads(a.q, a.k, b.q, b.k) && SameOptions(a.options, b.options) &&
         a.deterministic == b.deterministic && a.route == b.route;
}

int64_t QueryTokens(const ForwardInputs& in) { return in.q.shape[0]; }
int64_t QueryTokens(const BackwardInputs& in) { return in.q.shape[0]; }
int64_t KeyTokens(const ForwardInputs& in) { return in.k.shape[0]; }
int64_t KeyTokens(const BackwardInputs& in) { return in.k.shape[0]; }

template <typename Inputs>
BatchLayout LayOutBatch(const std::vector<const Inputs*>& parts) {
  BatchLayout layout;
  layout.q_row = {0};
  layout.k_row = {0};
  layout.cu_seqlens_q = {0};
  layout.cu_seqlens_k = {0};
  for (const Inputs* part : parts) {
    const int32_t q_base = static_cast<int32_t>(layout.q_row.back());
    const int32_t k_base = static_cast<int32_t>(layout.k_row.back());
    for (size_t i = 1; i < part->cu_seqlens_q.size(); ++i) {
      layout.cu_seqlens_q.push_back(q_base + part->cu_seqlens_q[i]);
      layout.cu_seqlens_k.push_back(k_base + part->cu_seqlens_k[i]);
    }
    layout.q_row.push_back(q_base + part->q.shape[0]);
    layout.k_row.push_back(k_base + part->k.shape[0]);
  }
  return layout;
}
template BatchLayout LayOutBatch(const std::vector<const ForwardInputs*>&);
template BatchLayout LayOutBatch(const std::vector<const BackwardInputs*>&);

template <typename Inputs>
std::vector<Piece> RowPieces(const std::vector<const Inputs*>& parts, TensorView Inputs::*member) {
  std::vector<Piece> pieces;
  for (const Inputs* part : parts) {
    pieces.push_back({(part->*member).data, (part->*member).size_bytes});
  }
  return pieces;
}
template std::vector<Piece> RowPieces(const std::vector<const ForwardInputs*>&,
                                      TensorView ForwardInputs::*);
template std::vector<Piece> RowPieces(const std::vector<const BackwardInputs*>&,
                                      TensorView BackwardInputs::*);

std::vector<Piece> LsePieces(const std::vector<const BackwardInputs*>& parts) {
  std::vector<Piece> pieces;
  const int64_t heads = parts[0]->q.shape[1];
  for (int64_t h = 0; h < heads; ++h) {
    for (const BackwardInputs* part : parts) {
      const int64_t rows = part->q.shape[0];
      pieces.push_back({part->lse.data + sizeof(float) * h * rows, sizeof(float) * rows});
    }
  }
  return pieces;
}

std::string RowsOf(const char* merged, int64_t row_bytes, int64_t first, int64_t rows) {
  return std::string(merged + first * row_bytes, rows * row_bytes);
}

std::string LseColumnsOf(const char* merged, int64_t heads, int64_t total, int64_t first,
                         int64_t count) {
  std::string columns(sizeof(float) * heads * count, '\0');
  for (int64_t h = 0; h < heads; ++h) {
    std::memcpy(columns.data() + sizeof(float) * h * count,
                merged + sizeof(float) * (h * total + first), sizeof(float) * count);
  }
  return columns;
}

MergedForward MergeForward(const std::vector<const ForwardInputs*>& parts) {
  MergedForward merged;
  merged.layout = LayOutBatch(parts);
  const int64_t total_q = merged.layout.q_row.back(), total_k = merged.layout.k_row.back();
  ForwardInputs& in = merged.inputs;
  std::vector<size_t> offsets;
  merged.bytes.reserve(total_q * RowBytes(parts[0]->q) + 2 * total_k * RowBytes(parts[0]->k));
  const ForwardInputs& first = *parts[0];
  in.q = Append(RowPieces(parts, &ForwardInputs::q), first.q, total_q, merged.bytes, offsets);
  in.k = Append(RowPieces(parts, &ForwardInputs::k), first.k, total_k, merged.bytes, offsets);
  in.v = Append(RowPieces(parts, &ForwardInputs::v), first.v, total_k, merged.bytes, offsets);
  PointInto(merged.bytes, offsets, {&in.q, &in.k, &in.v});
  in.cu_seqlens_q = merged.layout.cu_seqlens_q;
  in.cu_seqlens_k = merged.layout.cu_seqlens_k;
  in.options = parts[0]->options;
  in.route = parts[0]->route;  // Compatible parts share it
  return merged;
}

MergedBackward MergeBackward(const std::vector<const BackwardInputs*>& parts) {
  MergedBackward merged;
  merged.layout = LayOutBatch(parts);
  const int64_t total_q = merged.layout.q_row.back(), total_k = merged.layout.k_row.back();
  BackwardInputs& in = merged.inputs;
  const int64_t heads = parts[0]->q.shape[1];
  std::vector<size_t> offsets;
  merged.bytes.reserve(3 * total_q * RowBytes(parts[0]->q) + 2 * total_k * RowBytes(parts[0]->k) +
                       sizeof(float) * heads * total_q);
  const BackwardInputs& first = *parts[0];
  auto append = [&](TensorView BackwardInputs::*member, int64_t rows) {
    return Append(RowPieces(parts, member), first.*member, rows, merged.bytes, offsets);
  };
  in.dout = append(&BackwardInputs::dout, total_q);
  in.q = append(&BackwardInputs::q, total_q);
  in.out = append(&BackwardInputs::out, total_q);
  in.k = append(&BackwardInputs::k, total_k);
  in.v = append(&BackwardInputs::v, total_k);
  in.lse = Append(LsePieces(parts), {DType::kFloat32, {heads, total_q}, nullptr, 0}, heads,
                  merged.bytes, offsets);
  PointInto(merged.bytes, offsets, {&in.dout, &in.q, &in.out, &in.k, &in.v, &in.lse});
  in.cu_seqlens_q = merged.layout.cu_seqlens_q;
  in.cu_seqlens_k = merged.layout.cu_seqlens_k;
  in.options = parts[0]->options;
  in.deterministic = parts[0]->deterministic;
  in.route = parts[0]->route;
  return merged;
}

std::vector<ForwardResult> SplitForward(const ForwardResult& merged, const BatchLayout& layout) {
  std::vector<ForwardResult> results(layout.q_row.size() - 1);
  for (size_t i = 0; i < results.size(); ++i) {
    const int64_t first = layout.q_row[i], rows = layout.q_row[i + 1] - first;
    results[i].out = SliceRows(merged.out, first, rows);
    results[i].lse = SliceLseColumns(merged.lse, first, rows);
    results[i].execution = merged.execution;
  }
  return results;
}

std::vector<BackwardResult> SplitBackward(const BackwardResult& merged, const BatchLayout& layout) {
  std::vector<BackwardResult> results(layout.q_row.size() - 1);
  for (size_t i = 0; i < results.size(); ++i) {
    const int64_t q_first = layout.q_row[i], q_rows = layout.q_row[i + 1] - q_first;
    const int64_t k_first = layout.k_row[i], k_rows = layout.k_row[i + 1] - k_first;
    results[i].dq = SliceRows(merged.dq, q_first, q_rows);
    results[i].dk = SliceRows(merged.dk, k_first, k_rows);
    results[i].dv = SliceRows(merged.dv, k_first, k_rows);
    results[i].execution = merged.execution;
  }
  return results;
}

}  // namespace attnserve::engine
