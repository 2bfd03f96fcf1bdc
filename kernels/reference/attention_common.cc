#include "kernels/reference/attention_common.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/dropout_mask.h"
#include "kernels/reference/tile_gemm.h"

namespace attnserve::kernels::reference {
namespace {

KernelStatus ValidateOffsets(const int32_t* cu_seqlens, int batch, int64_t total,
                             const char* name, const char* total_name) {
  const std::string field(name);
  if (batch == 0) {
    if (total != 0) {
      return KernelStatus::Error("batch is 0 but " + std::string(total_name) + " is " +
                                 std::to_string(total));
    }
    return KernelStatus::Ok();
  }
  if (cu_seqlens == nullptr) return KernelStatus::Error(field + " is null");
  if (cu_seqlens[0] != 0) {
    return KernelStatus::Error(field + "[0] must be 0, got " + std::to_string(cu_seqlens[0]));
  }
  for (int b = 0; b < batch; ++b) {
    if (cu_seqlens[b + 1] < cu_seqlens[b]) {
      return KernelStatus::Error(field + " decreases at index " + std::to_string(b + 1));
    }
  }
  if (cu_seqlens[batch] != total) {
    return KernelStatus::Error(field + "[batch] is " + std::to_string(cu_seqlens[batch]) +
                               " but " + total_name + " is " + std::to_string(total));
  }
  return KernelStatus::Ok();
}

}  // namespace

KernelStatus ValidateShape(const AttentionShape& shape) {
  if (shape.dtype != DType::kFloat16 && shape.dtype != DType::kBFloat16 &&
      shape.dtype != DType::kFloat32) {
    return KernelStatus::Error("unknown dtype");
  }
  if (shape.batch < 0) return KernelStatus::Error("batch must be >= 0");
  if (shape.num_heads < 1 || shape.num_heads_k < 1) {
    return KernelStatus::Error("num_heads and num_heads_k must be >= 1, got " +
                               std::to_string(shape.num_heads) + " and " +
                               std::to_string(shape.num_heads_k));
  }
  if (shape.num_heads % shape.num_heads_k != 0) {
    return KernelStatus::Error("num_heads (" + std::to_string(shape.num_heads) +
                               ") must be a multiple of num_heads_k (" +
                               std::to_string(shape.num_heads_k) + ")");
  }
  if (shape.head_dim < 1) {
    return KernelStatus::Error("head_dim must be >= 1, got " + std::to_string(shape.head_dim));
  }
  KernelStatus status = ValidateOffsets(shape.cu_seqlens_q, shape.batch, shape.total_q,
                                        "cu_seqlens_q", "total_q");
  if (!status.ok) return status;
  return ValidateOffsets(shape.cu_seqlens_k, shape.batch, shape.total_k, "cu_seqlens_k",
                         "total_k");
}

KernelStatus CheckPointer(const void* data, int64_t elements, const char* name) {
  if (elements > 0 && data == nullptr) {
    return KernelStatus::Error(std::string(name) + " is null but has " +
                               std::to_string(elements) + " elements");
  }
  return KernelStatus::Ok();
}

HeadDims GetHeadDims(const AttentionShape& shape) {
  return {shape.head_dim, RoundUp(shape.head_dim, kTileCols), shape.num_heads / shape.num_heads_k};
}

Sequence GetSequence(const AttentionShape& shape, int b) {
  const int64_t q_begin = shape.cu_seqlens_q[b];
  const int64_t k_begin = shape.cu_seqlens_k[b];
  return {q_begin, shape.cu_seqlens_q[b + 1] - q_begin, k_begin,
          shape.cu_seqlens_k[b + 1] - k_begin};
}

KeyRange VisibleKeys(const AttentionOptions& options, int64_t len_q, int64_t len_k, int64_t i) {
  // Row i is aligned with key i + len_k - len_q (bottom-right alignment).
  const int64_t diagonal = i + len_k - len_q;
  KeyRange range{0, len_k - 1};
  if (options.causal) range.last = std::min(range.last, diagonal);
  if (options.window_right >= 0) range.last = std::min(range.last, diagonal + options.window_right);
  if (options.window_left >= 0) range.first = std::max(range.first, diagonal - options.window_left);
  return range;
}

KeyRange TileAlignedUnion(const KeyRange* ranges, int rows, int64_t padded_keys) {
  KeyRange all{padded_keys, -1};
  for (int r = 0; r < rows; ++r) {
    if (ranges[r].empty()) continue;
    all.first = std::min(all.first, ranges[r].first);
    all.last = std::max(all.last, ranges[r].last);
  }
  if (all.empty()) return all;
  all.first = all.first / kTileCols * kTileCols;
  all.last = std::min(RoundUp(all.last + 1, kTileCols), padded_keys) - 1;
  return all;
}

AlibiRow GetAlibiRow(const AttentionOptions& options, int b, int h, int64_t len_q, int64_t len_k,
                     int64_t i) {
  if (options.alibi_slopes == nullptr) return {};
  const int64_t row = static_cast<int64_t>(options.first_sequence) + b;
  return {options.alibi_slopes[row * options.alibi_slopes_stride + h], i + len_k - len_q};
}

void DropoutMultipliers(const AttentionOptions& options, int b, int h, int64_t i,
                        const KeyRange& keys, float* multipliers) {
  const uint32_t threshold = DropoutThreshold(options.dropout_p);
  const float kept = 1.0f / (1.0f - options.dropout_p);
  const uint32_t sequence = static_cast<uint32_t>(options.first_sequence + b);
  // One Philox call covers 4 aligned key columns; start at the group holding keys.first.
  for (int64_t group = keys.first / 4 * 4; group <= keys.last; group += 4) {
    const Philox4 bits = DropoutBits(options.dropout_seed, sequence, static_cast<uint32_t>(h),
                                     static_cast<uint32_t>(i), static_cast<uint32_t>(group));
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t j = group + lane;
      if (j < keys.first || j > keys.last) continue;
      multipliers[j - keys.first] = DropoutKeep(bits.v[lane], threshold) ? kept : 0.0f;
    }
  }
}

ScoreTransform::ScoreTransform(const AttentionOptions& options, int head_dim)
    : scale_(options.softmax_scale != 0.0f
                 ? options.softmax_scale
                 : 1.0f / std::sqrt(static_cast<float>(head_dim))),
      softcap_(options.softcap > 0.0f ? options.softcap : 0.0f),
      inv_softcap_(options.softcap > 0.0f ? 1.0f / options.softcap : 0.0f) {}

}  // namespace attnserve::kernels::reference
