// The float32 dQ workspace of the Hopper backward at head dims 64 / 128 / 192: laid out by
// query tile instead of by row, so that each consumer warp's share of a tile's dQ (16 rows x half
// the head dim) is one contiguous block that it adds with a single bulk reduction
// (FlashAttention-3's way), and the conversion kernel (bwd_sm90_dq_tiles.cuh) puts the rows back
// in place.
//
// Layout: the tile of 64 query rows from row0 of sequence b (first query q_begin), query head h,
// is the chunk of 64 x kHeadDim floats at ((q_begin + 64 b + row0) * num_heads + 64 h) *
// kHeadDim. The 64 b keeps the chunks of different sequences apart (a sequence's last tile may
// run up to 63 rows past its end), so the workspace holds (total_q + 64 batch) rows. In a chunk,
// warp piece p = 4 warpgroup + warp (rows 16 warp.., half the head dim's columns) is
// 16 x kHeadDim / 2 floats from p * 16 * kHeadDim / 2, in accumulator order: float4 t * 32 +
// lane holds the lane's values of 8-column tile t (rows lane / 4 and lane / 4 + 8, columns
// TileDqColumn(t) + 2 (lane % 4) + {0, 1}), so a warp stages it with conflict-free 16-byte
// stores.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTN_TILE_DQ_FN __host__ __device__ __forceinline__
#else
#define ATTN_TILE_DQ_FN inline
#endif

namespace attnserve::kernels::flash {

inline constexpr int kTileDqRows = 64;

ATTN_TILE_DQ_FN int64_t TileDqChunkOffset(int64_t q_begin, int batch_index, int row0, int head,
                                          int num_heads, int head_dim) {
  return ((q_begin + int64_t{kTileDqRows} * batch_index + row0) * num_heads +
          int64_t{kTileDqRows} * head) *
         head_dim;
}

// The first column of 8-column tile t of warpgroup wg's pieces: its half of the head dim in
// order at 64 / 128; at 192 the wide kernel's two dQ products (bwd_sm90_wide_traits.cuh), its
// 64 columns from 128 wg, then its 32 from 64 + 32 wg.
ATTN_TILE_DQ_FN constexpr int TileDqColumn(int head_dim, int wg, int t) {
  return head_dim != 192 ? wg * head_dim / 2 + t * 8
                         : (t < 8 ? wg * 128 + t * 8 : 64 + wg * 32 + (t - 8) * 8);
}

ATTN_TILE_DQ_FN int64_t TileDqWorkspaceFloats(int64_t total_q, int batch, int num_heads,
                                              int head_dim) {
  return (total_q + int64_t{kTileDqRows} * batch) * num_heads * head_dim;
}

}  // namespace attnserve::kernels::flash

#undef ATTN_TILE_DQ_FN
