// Exact CPU forward. Sequences are processed in chunks: first K^T and V of every
// (sequence, kv head) in the chunk are converted to float once (shared by all query heads of
// the group), then (query block, query head) work items compute the scores of a whole block of
// rows against every key they can see. There is no online softmax: each row's softmax is the
// plain max / exp / sum over all its scores.
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "kernels/reference/attention_common.h"
#include "kernels/reference/parallel_for.h"
#include "kernels/reference/reference_attention.h"
#include "kernels/reference/tensor_io.h"
#include "kernels/reference/tile_gemm.h"

namespace attnserve::kernels::reference {
namespace {

// Floats of converted K/V held at once; bounds memory for huge batches while keeping a single
// chunk (one parallel phase) for anything a server request normally carries. 256 MiB.
constexpr int64_t kChunkFloats = int64_t{1} << 26;

// Floats of converted K and V for all kv heads of sequence b.
int64_t KvFloats(const AttentionShape& shape, const HeadDims& dims, int b) {
  return 2 * RoundUp(GetSequence(shape, b).len_k, kTileCols) * dims.padded_dim * shape.num_heads_k;
}

// Float K^T [padded_dim x padded_keys] and V [padded_keys x padded_dim] of one
// (sequence, kv head), zero outside the real keys and dims so padded tiles contribute nothing.
struct KvBlock {
  float* kt;
  float* v;
  int64_t padded_keys;
};

// Sequences [first, end) whose converted K/V fit in one scratch allocation.
class KvChunk {
 public:
  KvChunk(const ForwardParams& params, const HeadDims& dims, int first, int end)
      : first_(first), num_heads_k_(params.shape.num_heads_k) {
    int64_t floats = 0;
    for (int b = first; b < end; ++b) {
      const int64_t padded_keys = RoundUp(GetSequence(params.shape, b).len_k, kTileCols);
      for (int g = 0; g < num_heads_k_; ++g) {
        blocks_.push_back({nullptr, nullptr, padded_keys});
        offsets_.push_back(floats);
        floats += 2 * padded_keys * dims.padded_dim;
      }
    }
    storage_.resize(floats);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      blocks_[i].kt = storage_.data() + offsets_[i];
      blocks_[i].v = blocks_[i].kt + blocks_[i].padded_keys * dims.padded_dim;
    }
  }

  KvBlock& block(int b, int g) { return blocks_[(b - first_) * num_heads_k_ + g]; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }

 private:
  int first_;
  int num_heads_k_;
  std::vector<KvBlock> blocks_;
  std::vector<int64_t> offsets_;
  std::vector<float> storage_;
};

// Per-worker scratch, grown on demand and reused across work items.
struct Scratch {
  std::vector<float> row;     // one converted K/V row
  std::vector<float> q;       // [kQueryBlock x padded_dim]
  std::vector<float> scores;  // [kQueryBlock x padded_keys]: scores, then probabilities
  std::vector<float> out;     // [kQueryBlock x padded_dim]
  std::vector<float> dropout;  // one row's dropout multipliers (dropout on only)
};

void ConvertKv(const ForwardParams& params, const HeadDims& dims, const Sequence& seq, int g,
               std::vector<float>& row, KvBlock& block) {
  const AttentionShape& shape = params.shape;
  std::fill(block.kt, block.kt + 2 * block.padded_keys * dims.padded_dim, 0.0f);
  row.resize(dims.head_dim);
  for (int64_t j = 0; j < seq.len_k; ++j) {
    const int64_t offset = ((seq.k_begin + j) * shape.num_heads_k + g) * dims.head_dim;
    LoadRow(shape.dtype, params.k, offset, static_cast<int>(dims.head_dim), row.data());
    for (int64_t c = 0; c < dims.head_dim; ++c) block.kt[c * block.padded_keys + j] = row[c];
    LoadRow(shape.dtype, params.v, offset, static_cast<int>(dims.head_dim),
            block.v + j * dims.padded_dim);
  }
}

// Turns one row of raw q.k products over the tile columns `cols` into probabilities, in place:
// softmax over the row's visible keys (ALiBi added to the scores), 0 elsewhere. Returns lse,
// or +inf for a row that sees nothing (all probabilities 0, so its out is 0).
float SoftmaxRow(const ScoreTransform& transform, const AlibiRow& alibi, const KeyRange& visible,
                 const KeyRange& cols, float* scores) {
  const int64_t width = cols.last - cols.first + 1;
  if (visible.empty()) {
    std::fill(scores, scores + width, 0.0f);
    return std::numeric_limits<float>::infinity();
  }
  float* first = scores + (visible.first - cols.first);
  float* last = scores + (visible.last - cols.first) + 1;
  float max_score = -std::numeric_limits<float>::infinity();
  if (alibi.slope == 0.0f) {
    for (float* s = first; s != last; ++s) {
      *s = transform.Score(*s);
      max_score = std::max(max_score, *s);
    }
  } else {
    for (float* s = first; s != last; ++s) {
      *s = transform.Score(*s) + alibi.Bias(visible.first + (s - first));
      max_score = std::max(max_score, *s);
    }
  }
  float sum = 0.0f;
  for (float* s = first; s != last; ++s) {
    *s = std::exp(*s - max_score);
    sum += *s;
  }
  // Normalising P here (not O afterwards) keeps O = P.V a single GEMM.
  const float inv_sum = 1.0f / sum;
  for (float* s = first; s != last; ++s) *s *= inv_sum;
  std::fill(scores, first, 0.0f);
  std::fill(last, scores + width, 0.0f);
  return max_score + std::log(sum);
}

// One block of up to kQueryBlock rows of sequence `seq` (index b of the launch), query head h.
void ForwardBlock(const ForwardParams& params, const HeadDims& dims,
                  const ScoreTransform& transform, int b, const Sequence& seq, int64_t row_begin,
                  int h, const KvBlock& kv, Scratch& scratch) {
  const AttentionShape& shape = params.shape;
  const int rows = static_cast<int>(std::min<int64_t>(kQueryBlock, seq.len_q - row_begin));
  const int64_t tile_rows = RoundUp(rows, kTileRows);
  const int64_t pd = dims.padded_dim;

  KeyRange visible[kQueryBlock] = {};
  for (int r = 0; r < rows; ++r) {
    visible[r] = VisibleKeys(params.options, seq.len_q, seq.len_k, row_begin + r);
  }
  const KeyRange cols = TileAlignedUnion(visible, rows, kv.padded_keys);
  const int64_t width = cols.empty() ? 0 : cols.last - cols.first + 1;

  scratch.out.assign(tile_rows * pd, 0.0f);
  if (width > 0) {
    scratch.q.assign(tile_rows * pd, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const int64_t offset = ((seq.q_begin + row_begin + r) * shape.num_heads + h) * dims.head_dim;
      LoadRow(shape.dtype, params.q, offset, static_cast<int>(dims.head_dim),
              scratch.q.data() + r * pd);
    }
    scratch.scores.assign(tile_rows * width, 0.0f);
    GemmAccumulate(tile_rows, width, pd, {scratch.q.data(), pd, 1}, kv.kt + cols.first,
                   kv.padded_keys, scratch.scores.data(), width);
  }

  float lse[kQueryBlock];
  const AttentionOptions& options = params.options;
  for (int r = 0; r < rows; ++r) {
    if (width == 0) {
      lse[r] = std::numeric_limits<float>::infinity();
      continue;
    }
    const int64_t i = row_begin + r;
    float* probs = scratch.scores.data() + r * width;
    lse[r] = SoftmaxRow(transform, GetAlibiRow(options, b, h, seq.len_q, seq.len_k, i),
                        visible[r], cols, probs);
    // lse stays that of the undropped softmax (as FlashAttention's); only P.V sees the mask.
    if (options.has_dropout() && !visible[r].empty()) {
      scratch.dropout.resize(visible[r].last - visible[r].first + 1);
      DropoutMultipliers(options, b, h, i, visible[r], scratch.dropout.data());
      float* kept = probs + (visible[r].first - cols.first);
      for (size_t j = 0; j < scratch.dropout.size(); ++j) kept[j] *= scratch.dropout[j];
    }
  }
  if (width > 0) {
    // Padded rows (r >= rows) have all-zero q; zero their probabilities so they stay inert.
    std::fill(scratch.scores.begin() + rows * width, scratch.scores.end(), 0.0f);
    GemmAccumulate(tile_rows, pd, width, {scratch.scores.data(), width, 1},
                   kv.v + cols.first * pd, pd, scratch.out.data(), pd);
  }

  for (int r = 0; r < rows; ++r) {
    const int64_t row = seq.q_begin + row_begin + r;
    StoreRow(shape.dtype, scratch.out.data() + r * pd, static_cast<int>(dims.head_dim),
             params.out, (row * shape.num_heads + h) * dims.head_dim);
    StoreFloat(lse[r], params.lse, h * shape.total_q + row);
  }
}

KernelStatus ValidateForward(const ForwardParams& params) {
  KernelStatus status = ValidateShape(params.shape);
  if (!status.ok) return status;
  const AttentionShape& s = params.shape;
  const int64_t q_elements = s.total_q * s.num_heads * s.head_dim;
  const int64_t kv_elements = s.total_k * s.num_heads_k * s.head_dim;
  for (const KernelStatus& check :
       {CheckPointer(params.q, q_elements, "q"), CheckPointer(params.k, kv_elements, "k"),
        CheckPointer(params.v, kv_elements, "v"), CheckPointer(params.out, q_elements, "out"),
        CheckPointer(params.lse, s.total_q * s.num_heads, "lse")}) {
    if (!check.ok) return check;
  }
  return KernelStatus::Ok();
}

// Forward for sequences [first, end): convert their K/V, then run every query block.
KernelStatus ForwardChunk(const ForwardParams& params, const ExecutionContext& ctx,
                          const HeadDims& dims, int first, int end) {
  const AttentionShape& shape = params.shape;
  KvChunk chunk(params, dims, first, end);

  // Work items of the second phase: (sequence, first row of a query block) x query head.
  struct QueryBlock {
    int b;
    int64_t row_begin;
  };
  std::vector<QueryBlock> blocks;
  for (int b = first; b < end; ++b) {
    const int64_t len_q = GetSequence(shape, b).len_q;
    for (int64_t row = 0; row < len_q; row += kQueryBlock) blocks.push_back({b, row});
  }
  const int64_t items = static_cast<int64_t>(blocks.size()) * shape.num_heads;
  std::vector<Scratch> scratch(ResolveWorkers(ctx, std::max(chunk.num_blocks(), items)));

  KernelStatus status = ParallelFor(
      chunk.num_blocks(), ResolveWorkers(ctx, chunk.num_blocks()), [&](int64_t item, int worker) {
        const int b = first + static_cast<int>(item / shape.num_heads_k);
        const int g = static_cast<int>(item % shape.num_heads_k);
        ConvertKv(params, dims, GetSequence(shape, b), g, scratch[worker].row, chunk.block(b, g));
      },
      ctx.should_stop);
  if (!status.ok) return status;

  const ScoreTransform transform(params.options, shape.head_dim);
  return ParallelFor(items, ResolveWorkers(ctx, items), [&](int64_t item, int worker) {
    const QueryBlock& block = blocks[item / shape.num_heads];
    const int h = static_cast<int>(item % shape.num_heads);
    ForwardBlock(params, dims, transform, block.b, GetSequence(shape, block.b),
                 block.row_begin, h, chunk.block(block.b, h / dims.group), scratch[worker]);
  }, ctx.should_stop);
}

}  // namespace

KernelStatus Forward(const ForwardParams& params, const ExecutionContext& ctx) {
  KernelStatus status = ValidateForward(params);
  if (!status.ok) return status;
  const AttentionShape& shape = params.shape;
  const HeadDims dims = GetHeadDims(shape);
  try {
    int first = 0;
    while (first < shape.batch) {
      // Greedily extend the chunk while its K/V copies fit (always at least one sequence).
      int end = first + 1;
      int64_t floats = KvFloats(shape, dims, first);
      while (end < shape.batch && floats + KvFloats(shape, dims, end) <= kChunkFloats) {
        floats += KvFloats(shape, dims, end++);
      }
      status = ForwardChunk(params, ctx, dims, first, end);
      if (!status.ok) return status;
      first = end;
    }
  } catch (const std::exception& e) {
    return KernelStatus::Error(std::string("reference forward failed: ") + e.what());
  }
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::reference
