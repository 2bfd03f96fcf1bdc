// Which query tiles a key block of the dK/dV kernels meets under the mask: the one place that
// turns causal and sliding windows (bottom-right aligned) into a range of query tiles for the
// sm80 kernels (bwd_dkdv_kernel.cuh, bwd_dkdv_pair_kernel.cuh) and the sm90 one
// (bwd_sm90_block.cuh).
#pragma once

namespace attnserve::kernels::flash {

// Query tiles [begin, begin + count) of kBlockM rows.
struct QueryTiles {
  int begin;
  int count;
};

// The query tiles whose rows see some key of [key_first, key_last]. Query row i sees keys
// [i + offset - window_left, i + offset + window_right] (offset = len_k - len_q; unbounded
// windows are large, causal is window_right 0), so the rows that see a key of the block are
// [key_first - window_right - offset, key_last + window_left - offset], within [0, len_q).
// `f`: the kernel's arguments (their window_left, window_right).
template <int kBlockM, typename Args>
__device__ __forceinline__ QueryTiles QueryTilesOfKeyBlock(const Args& f, int key_first,
                                                           int key_last, int len_q, int offset) {
  const int row_first = max(0, key_first - f.window_right - offset);
  const int row_last = min(len_q - 1, key_last + f.window_left - offset);
  const int begin = row_first / kBlockM;
  return {begin, row_first > row_last ? 0 : row_last / kBlockM - begin + 1};
}

}  // namespace attnserve::kernels::flash
