// Exact CPU backward, recomputing P = exp(s - lse) from the forward's lse. One work item per
// (sequence, kv head): it converts that head's K once, walks every query head of its group and
// every query block, and owns its dk/dv rows and its query heads' dq rows outright. No two
// workers write the same element and every sum runs in a fixed order, so results are bitwise
// identical for any thread count and `deterministic` is honoured trivially.
#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "kernels/reference/attention_common.h"
#include "kernels/reference/parallel_for.h"
#include "kernels/reference/reference_attention.h"
#include "kernels/reference/tensor_io.h"
#include "kernels/reference/tile_gemm.h"

namespace attnserve::kernels::reference {
namespace {

// Per-worker scratch, grown on demand and reused across work items. "pk" is the key count
// padded to whole tiles, "pd" the padded head_dim; padding is always zero.
struct Scratch {
  std::vector<float> row;                // one converted input row
  std::vector<float> k, dk, dv;          // [pk x pd]
  std::vector<float> kt, vt;             // [pd x pk]
  std::vector<float> q, dout, dq;        // [kQueryBlock x pd]
  std::vector<float> probs, derivative;  // [kQueryBlock x width]: P and d(score)/d(q.k)
  std::vector<float> dscores;            // [kQueryBlock x width]: dP, then dS
  std::vector<float> dropout;            // one row's dropout multipliers (dropout on only)
};

// Converts K and V of one (sequence, kv head) and clears its dk/dv accumulators.
void LoadKv(const BackwardParams& params, const HeadDims& dims, const Sequence& seq, int g,
            int64_t pk, Scratch& s) {
  const AttentionShape& shape = params.shape;
  const int64_t pd = dims.padded_dim;
  const int d = static_cast<int>(dims.head_dim);
  s.k.assign(pk * pd, 0.0f);
  s.kt.assign(pd * pk, 0.0f);
  s.vt.assign(pd * pk, 0.0f);
  s.row.resize(d);
  for (int64_t j = 0; j < seq.len_k; ++j) {
    const int64_t offset = ((seq.k_begin + j) * shape.num_heads_k + g) * dims.head_dim;
    float* k_row = s.k.data() + j * pd;
    LoadRow(shape.dtype, params.k, offset, d, k_row);
    LoadRow(shape.dtype, params.v, offset, d, s.row.data());
    for (int c = 0; c < d; ++c) {
      s.kt[c * pk + j] = k_row[c];
      s.vt[c * pk + j] = s.row[c];
    }
  }
  s.dk.assign(pk * pd, 0.0f);
  s.dv.assign(pk * pd, 0.0f);
}

// Loads rows [row_begin, row_begin + rows) of query head h of `tensor` into a zeroed tile.
void LoadQueryTile(const BackwardParams& params, const HeadDims& dims, const void* tensor,
                   int64_t first_row, int rows, int64_t tile_rows, int h,
                   std::vector<float>& tile) {
  const AttentionShape& shape = params.shape;
  tile.assign(tile_rows * dims.padded_dim, 0.0f);
  for (int r = 0; r < rows; ++r) {
    LoadRow(shape.dtype, tensor, ((first_row + r) * shape.num_heads + h) * dims.head_dim,
            static_cast<int>(dims.head_dim), tile.data() + r * dims.padded_dim);
  }
}

// One row over the tile columns `cols`: on entry `probs` holds q.k, on return P = exp(score - lse)
// and `derivative` d(score)/d(q.k) on the visible keys; P is 0 elsewhere (derivative untouched,
// the caller zeroed it).
void ProbabilitiesRow(const ScoreTransform& transform, const AlibiRow& alibi,
                      const KeyRange& visible, const KeyRange& cols, float lse, float* probs,
                      float* derivative) {
  const int64_t width = cols.last - cols.first + 1;
  if (visible.empty()) {
    std::fill(probs, probs + width, 0.0f);
    return;
  }
  if (alibi.slope == 0.0f) {
    for (int64_t j = visible.first - cols.first; j <= visible.last - cols.first; ++j) {
      probs[j] = std::exp(transform.ScoreAndDerivative(probs[j], &derivative[j]) - lse);
    }
  } else {
    // ALiBi is a constant per (row, key): it shifts the score, not its derivative.
    for (int64_t j = visible.first - cols.first; j <= visible.last - cols.first; ++j) {
      probs[j] = std::exp(transform.ScoreAndDerivative(probs[j], &derivative[j]) +
                          alibi.Bias(cols.first + j) - lse);
    }
  }
  std::fill(probs, probs + (visible.first - cols.first), 0.0f);
  std::fill(probs + (visible.last - cols.first) + 1, probs + width, 0.0f);
}

// One block of up to kQueryBlock rows of query head h of sequence `seq` (index b of the
// launch): writes its dq rows and accumulates into the item's dk/dv.
void BackwardBlock(const BackwardParams& params, const HeadDims& dims,
                   const ScoreTransform& transform, int b, const Sequence& seq,
                   int64_t row_begin, int h, int64_t pk, Scratch& s) {
  const AttentionShape& shape = params.shape;
  const int rows = static_cast<int>(std::min<int64_t>(kQueryBlock, seq.len_q - row_begin));
  const int64_t tile_rows = RoundUp(rows, kTileRows);
  const int64_t pd = dims.padded_dim;
  const int d = static_cast<int>(dims.head_dim);
  const int64_t first_row = seq.q_begin + row_begin;

  KeyRange visible[kQueryBlock] = {};
  for (int r = 0; r < rows; ++r) {
    visible[r] = VisibleKeys(params.options, seq.len_q, seq.len_k, row_begin + r);
  }
  const KeyRange cols = TileAlignedUnion(visible, rows, pk);
  s.dq.assign(tile_rows * pd, 0.0f);
  if (!cols.empty()) {
    const int64_t width = cols.last - cols.first + 1;
    LoadQueryTile(params, dims, params.q, first_row, rows, tile_rows, h, s.q);
    LoadQueryTile(params, dims, params.dout, first_row, rows, tile_rows, h, s.dout);

    // S = Q.K^T, turned row by row into P (and dscore/d(q.k)) in place.
    s.probs.assign(tile_rows * width, 0.0f);
    s.derivative.assign(tile_rows * width, 0.0f);
    GemmAccumulate(tile_rows, width, pd, {s.q.data(), pd, 1}, s.kt.data() + cols.first, pk,
                   s.probs.data(), width);
    // dP = dO.V^T
    s.dscores.assign(tile_rows * width, 0.0f);
    GemmAccumulate(tile_rows, width, pd, {s.dout.data(), pd, 1}, s.vt.data() + cols.first, pk,
                   s.dscores.data(), width);

    s.row.resize(d);
    for (int64_t r = 0; r < tile_rows; ++r) {
      float* probs = s.probs.data() + r * width;
      float* derivative = s.derivative.data() + r * width;
      float* dscores = s.dscores.data() + r * width;
      if (r >= rows || visible[r].empty()) {
        // Padded rows and rows that see no key contribute nothing.
        std::fill(probs, probs + width, 0.0f);
        std::fill(dscores, dscores + width, 0.0f);
        continue;
      }
      const int64_t row = first_row + r;
      const float lse = LoadFloat(params.lse, h * shape.total_q + row);
      const int64_t i = row_begin + r;
      ProbabilitiesRow(transform, GetAlibiRow(params.options, b, h, seq.len_q, seq.len_k, i),
                       visible[r], cols, lse, probs, derivative);
      // D = rowsum(dO o O) with the caller's out, as FlashAttention does.
      LoadRow(shape.dtype, params.out, (row * shape.num_heads + h) * dims.head_dim, d,
              s.row.data());
      const float* dout = s.dout.data() + r * pd;
      float delta = 0.0f;
      for (int c = 0; c < d; ++c) delta += dout[c] * s.row[c];
      // With dropout (Z the mask, m = Z / (1 - p)): dP = m o (dO.V^T), dS = P o (dP - D) with
      // the undropped P, and dV takes the dropped m o P; D = rowsum(dO o O) holds as is, O
      // being the dropped output.
      const bool dropout = params.options.has_dropout();
      const int64_t at = visible[r].first - cols.first;
      if (dropout) {
        s.dropout.resize(visible[r].last - visible[r].first + 1);
        DropoutMultipliers(params.options, b, h, i, visible[r], s.dropout.data());
        for (size_t j = 0; j < s.dropout.size(); ++j) dscores[at + j] *= s.dropout[j];
      }
      // dS = P o (dP - D) o dscore/d(q.k); masked entries have P = 0 and derivative = 0.
      for (int64_t j = 0; j < width; ++j) {
        dscores[j] = probs[j] == 0.0f ? 0.0f : probs[j] * (dscores[j] - delta) * derivative[j];
      }
      if (dropout) {
        for (size_t j = 0; j < s.dropout.size(); ++j) probs[at + j] *= s.dropout[j];
      }
    }

    // dQ = dS.K, dK += dS^T.Q, dV += P^T.dO (P dropped when dropout is on)
    GemmAccumulate(tile_rows, pd, width, {s.dscores.data(), width, 1},
                   s.k.data() + cols.first * pd, pd, s.dq.data(), pd);
    GemmAccumulate(width, pd, tile_rows, {s.dscores.data(), 1, width}, s.q.data(), pd,
                   s.dk.data() + cols.first * pd, pd);
    GemmAccumulate(width, pd, tile_rows, {s.probs.data(), 1, width}, s.dout.data(), pd,
                   s.dv.data() + cols.first * pd, pd);
  }
  for (int r = 0; r < rows; ++r) {
    StoreRow(shape.dtype, s.dq.data() + r * pd, d, params.dq,
             ((first_row + r) * shape.num_heads + h) * dims.head_dim);
  }
}

// All of dq for the query heads of kv head g, and dk/dv of g, for one sequence.
void BackwardItem(const BackwardParams& params, const HeadDims& dims,
                  const ScoreTransform& transform, int b, const Sequence& seq, int g,
                  Scratch& s) {
  const AttentionShape& shape = params.shape;
  const int64_t pk = RoundUp(seq.len_k, kTileCols);
  LoadKv(params, dims, seq, g, pk, s);
  for (int h = g * dims.group; h < (g + 1) * dims.group; ++h) {
    for (int64_t row = 0; row < seq.len_q; row += kQueryBlock) {
      BackwardBlock(params, dims, transform, b, seq, row, h, pk, s);
    }
  }
  for (int64_t j = 0; j < seq.len_k; ++j) {
    const int64_t offset = ((seq.k_begin + j) * shape.num_heads_k + g) * dims.head_dim;
    StoreRow(shape.dtype, s.dk.data() + j * dims.padded_dim, static_cast<int>(dims.head_dim),
             params.dk, offset);
    StoreRow(shape.dtype, s.dv.data() + j * dims.padded_dim, static_cast<int>(dims.head_dim),
             params.dv, offset);
  }
}

KernelStatus ValidateBackward(const BackwardParams& params) {
  KernelStatus status = ValidateShape(params.shape);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  const int64_t q_elements = s.total_q * s.num_heads * s.head_dim;
  const int64_t kv_elements = s.total_k * s.num_heads_k * s.head_dim;
  for (const KernelStatus& check :
       {CheckPointer(params.q, q_elements, "q"), CheckPointer(params.k, kv_elements, "k"),
        CheckPointer(params.v, kv_elements, "v"), CheckPointer(params.out, q_elements, "out"),
        CheckPointer(params.dout, q_elements, "dout"),
        CheckPointer(params.lse, s.total_q * s.num_heads, "lse"),
        CheckPointer(params.dq, q_elements, "dq"), CheckPointer(params.dk, kv_elements, "dk"),
        CheckPointer(params.dv, kv_elements, "dv")}) {
    if (!check.ok) return check;
  }
  return KernelStatus::Ok();
}

}  // namespace

KernelStatus Backward(const BackwardParams& params, const ExecutionContext& ctx) {
  KernelStatus status = ValidateBackward(params);
  if (!status.ok) return status;
  const AttentionShape& shape = params.shape;
  const HeadDims dims = GetHeadDims(shape);
  const ScoreTransform transform(params.options, shape.head_dim);
  const int64_t items = static_cast<int64_t>(shape.batch) * shape.num_heads_k;
  try {
    std::vector<Scratch> scratch(ResolveWorkers(ctx, items));
    return ParallelFor(items, static_cast<int>(scratch.size()), [&](int64_t item, int worker) {
      const int b = static_cast<int>(item / shape.num_heads_k);
      const int g = static_cast<int>(item % shape.num_heads_k);
      BackwardItem(params, dims, transform, b, GetSequence(shape, b), g, scratch[worker]);
    }, ctx.should_stop);
  } catch (const std::exception& e) {
    return KernelStatus::Error(std::string("reference backward failed: ") + e.what());
  }
}

}  // namespace attnserve::kernels::reference
