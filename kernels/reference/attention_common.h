// Pieces shared by the reference forward and backward: request checks, per-sequence spans, the
// FlashAttention mask as a key interval per query row, and the score transform.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_params.h"

namespace attnserve::kernels::reference {

// Query rows handled as one unit: a multiple of kTileRows, large enough that each K/V element
// loaded serves 32 rows, small enough that the block's q/dout rows (32 KiB at head_dim 256) stay
// in cache while the keys stream by.
constexpr int kQueryBlock = 32;

// x rounded up to a multiple of m (m > 0, x >= 0).
inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Shape, offsets and options a kernel can check cheaply; the engine validates the request first.
KernelStatus ValidateShape(const AttentionShape& shape);

// Error when a tensor with `elements` > 0 elements has no data pointer.
KernelStatus CheckPointer(const void* data, int64_t elements, const char* name);

// Head geometry: the real head_dim, the head_dim of float scratch (whole GEMM tiles, zero
// padded), and how many query heads share one kv head.
struct HeadDims {
  int64_t head_dim;
  int64_t padded_dim;
  int group;
};
HeadDims GetHeadDims(const AttentionShape& shape);

// One sequence of the packed batch: rows [q_begin, q_begin + len_q) of q and
// [k_begin, k_begin + len_k) of k/v.
struct Sequence {
  int64_t q_begin;
  int64_t len_q;
  int64_t k_begin;
  int64_t len_k;
};
Sequence GetSequence(const AttentionShape& shape, int b);

// Keys [first, last] of its sequence that query row i sees (bottom-right aligned causal and
// sliding window, as in FlashAttention >= 2.1). Empty when first > last.
struct KeyRange {
  int64_t first;
  int64_t last;
  bool empty() const { return first > last; }
};
KeyRange VisibleKeys(const AttentionOptions& options, int64_t len_q, int64_t len_k, int64_t i);

// Union of ranges[0, rows), widened to whole key tiles and
// clipped to the padded key count, so it can be used directly as a GEMM column range.
KeyRange TileAlignedUnion(const KeyRange* ranges, int rows, int64_t padded_keys);

// ALiBi of one (sequence, head, query row): score(j) -= slope * |diagonal - j| with
// diagonal = i + len_k - len_q, i and j within the sequence. slope 0 = off.
struct AlibiRow {
  float slope = 0.0f;
  int64_t diagonal = 0;
  float Bias(int64_t j) const {
    return -slope * static_cast<float>(diagonal > j ? diagonal - j : j - diagonal);
  }
};
// b is the sequence's index within the launch (options.first_sequence is added here).
AlibiRow GetAlibiRow(const AttentionOptions& options, int b, int h, int64_t len_q, int64_t len_k,
                     int64_t i);

// Dropout multipliers of one (sequence, head, query row) for key columns [first, last] of its
// sequence: 1 / (1 - p) where kept, 0 where dropped (kernels/dropout_mask.h). b as above.
void DropoutMultipliers(const AttentionOptions& options, int b, int h, int64_t i,
                        const KeyRange& keys, float* multipliers);

// score = scale * (q . k), then softcap * tanh(score / softcap) when softcap > 0. A zero scale
// (never sent by the engine) falls back to 1 / sqrt(head_dim).
class ScoreTransform {
 public:
  ScoreTransform(const AttentionOptions& options, int head_dim);
  float Score(float dot) const {
    const float s = scale_ * dot;
    return softcap_ > 0.0f ? softcap_ * std::tanh(s * inv_softcap_) : s;
  }
  // Returns the score of `dot` and stores d(score) / d(q . k), so backward pays for one tanh.
  float ScoreAndDerivative(float dot, float* derivative) const {
    const float s = scale_ * dot;
    if (softcap_ <= 0.0f) {
      *derivative = scale_;
      return s;
    }
    const float t = std::tanh(s * inv_softcap_);
    *derivative = scale_ * (1.0f - t * t);
    return softcap_ * t;
  }

 private:
  float scale_;
  float softcap_;      // 0 = off
  float inv_softcap_;  // 1 / softcap_ when on
};

}  // namespace attnserve::kernels::reference
