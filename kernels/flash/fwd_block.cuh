// Where a forward query block's work lies, shared by the sm80/sm75 kernel (fwd_kernel.cuh), the
// Hopper kernel (fwd_sm90_kernel.cuh, which walks many blocks per CTA) and the deterministic dQ
// pass (bwd_dq_kernel.cuh): the block's rows and the key tiles its rows see, and its pointers
// into q, out and lse.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_tile_io.cuh"

namespace attnserve::kernels::flash {

// Where one sequence's (query block, head) sits: row and key ranges, and which key tiles need
// element-wise masking.
struct FwdBlock {
  int row_first;     // first query row of the block, within the sequence
  int rows_valid;    // query rows of the block inside the sequence
  int len_k;
  int diagonal;      // key aligned with the block's first row: row_first + len_k - len_q
  int n_begin;       // key tiles [n_begin, n_end) hold every key any row of the block sees
  int n_end;
  int mask_from;     // tiles n >= mask_from cross the right edge or the end of the keys
  int mask_below;    // tiles n < mask_below cross the left window edge
};

// Key tiles [n_begin, n_end) that hold every key some row of a run of rows sees: the rows
// whose diagonals (key aligned with the row) are first_diagonal .. last_diagonal. Empty
// (n_begin >= n_end) when they see none. All in int32: rows and keys are below kMaxSeqLen and
// windows at most kUnboundedWindow.
struct KeyTiles {
  int n_begin;
  int n_end;
};
template <int kBlockN>
__device__ __forceinline__ KeyTiles RowsKeyTiles(const FwdKernelArgs& args, int first_diagonal,
                                                 int last_diagonal, int len_k) {
  // Keys past the bottom row's right edge and before the top row's left edge are never seen.
  const int key_end = min(len_k, last_diagonal + args.window_right + 1);
  const int key_begin = max(0, first_diagonal - args.window_left);
  return {min(key_begin, len_k) / kBlockN, key_end <= 0 ? 0 : (key_end + kBlockN - 1) / kBlockN};
}

// Query block m_block of a sequence of len_q rows: rows [m_block * kBlockM, + kBlockM), the
// partial block last; or with kBlocksFromEnd laid from the sequence's end, the partial block
// first. Under causal masking the last rows see the most keys: a partial block there leaves
// consumer warpgroups idle in the sequence's longest block, at the start in its shortest.
template <int kBlockM, int kBlockN, bool kBlocksFromEnd = false>
__device__ __forceinline__ FwdBlock LocateBlock(const FwdKernelArgs& args, int m_block,
                                                int len_q, int len_k) {
  FwdBlock b;
  if constexpr (kBlocksFromEnd) {
    // Rows the blocks laid from the end would reach before the sequence's first row.
    const int before = (kBlockM - len_q % kBlockM) % kBlockM;
    b.row_first = max(0, m_block * kBlockM - before);
    b.rows_valid = min((m_block + 1) * kBlockM - before, len_q) - b.row_first;
  } else {
    b.row_first = m_block * kBlockM;
    b.rows_valid = min(kBlockM, len_q - b.row_first);
  }
  b.len_k = len_k;
  b.diagonal = b.row_first + len_k - len_q;
  const int last_diagonal = b.diagonal + b.rows_valid - 1;  // the bottom row's
  const KeyTiles tiles = RowsKeyTiles<kBlockN>(args, b.diagonal, last_diagonal, len_k);
  b.n_begin = tiles.n_begin;
  b.n_end = tiles.n_end;
  // First key the top row does not see; tiles reaching it or the end of the keys need masking.
  const int top_hidden = b.diagonal + args.window_right + 1;
  b.mask_from = min(top_hidden <= 0 ? 0 : top_hidden / kBlockN, len_k / kBlockN);
  // First key the bottom row sees; tiles starting before it need masking.
  const int bottom_first = last_diagonal - args.window_left;
  b.mask_below = bottom_first <= 0 ? 0 : min((bottom_first + kBlockN - 1) / kBlockN, b.n_end);
  return b;
}

// One forward CTA's block and where its rows live: the block's first row of q (and of out,
// which has q's layout) at this head, its lse, and the offset of the sequence's first key row
// at the head's kv head in k and v.
template <typename Element>
struct FwdCta {
  FwdBlock block;
  const Element* q;
  Element* out;
  float* lse;
  int64_t kv_offset;
  // The same places as tensor coordinates (what TMA loads take, in int32: its launcher refuses
  // tensors of 2^31 rows or more): the block's first row of q and its head, the sequence's
  // first key row of k and v and the kv head.
  int q_row;
  int head;
  int k_row;
  int kv_head;
};

// Where packed row `row` of head `head` goes in out (q's layout), and its lse.
template <typename Element>
__device__ __forceinline__ Element* ForwardOutRow(const FwdKernelArgs& args, int64_t row,
                                                  int head) {
  return static_cast<Element*>(args.out) + row * args.q_row_stride + int64_t{head} * args.head_dim;
}
__device__ __forceinline__ float* ForwardLseRow(const FwdKernelArgs& args, int64_t row, int head) {
  return args.lse + head * args.total_q + row;
}

// Locates query block m_block of (head, sequence batch). Returns false when the block starts
// past the sequence (varlen batches size the grid by the longest sequence).
template <int kBlockM, int kBlockN, bool kBlocksFromEnd = false, typename Element>
__device__ __forceinline__ bool LocateForwardBlock(const FwdKernelArgs& args, int m_block,
                                                   int head, int batch, FwdCta<Element>& cta) {
  const int q_begin = args.cu_seqlens_q[batch];
  const int len_q = args.cu_seqlens_q[batch + 1] - q_begin;
  if (m_block * kBlockM >= len_q) return false;
  const int k_begin = args.cu_seqlens_k[batch];
  const int len_k = args.cu_seqlens_k[batch + 1] - k_begin;
  cta.block = LocateBlock<kBlockM, kBlockN, kBlocksFromEnd>(args, m_block, len_q, len_k);

  const int64_t first_row = int64_t{q_begin} + cta.block.row_first;
  const int64_t head_offset = int64_t{head} * args.head_dim;
  const int64_t kv_head_offset = int64_t{head / args.head_group} * args.head_dim;
  cta.q_row = static_cast<int>(first_row);
  cta.head = head;
  cta.k_row = k_begin;
  cta.kv_head = head / args.head_group;
  cta.q = static_cast<const Element*>(args.q) + first_row * args.q_row_stride + head_offset;
  cta.out = ForwardOutRow<Element>(args, first_row, head);
  cta.lse = ForwardLseRow(args, first_row, head);
  cta.kv_offset = int64_t{k_begin} * args.kv_row_stride + kv_head_offset;
  return true;
}

// The block's key tiles that rows [first_row, first_row + rows) of it see (a consumer
// warpgroup's share of the block): inside the block's own, empty at the block's n_end when
// those rows lie past the sequence or see no key.
template <int kBlockN>
__device__ __forceinline__ KeyTiles BlockRowsKeyTiles(const FwdKernelArgs& args,
                                                      const FwdBlock& block, int first_row,
                                                      int rows) {
  const int last_row = min(first_row + rows, block.rows_valid) - 1;
  if (last_row < first_row) return {block.n_end, block.n_end};
  const KeyTiles tiles = RowsKeyTiles<kBlockN>(args, block.diagonal + first_row,
                                               block.diagonal + last_row, block.len_k);
  const int n_end = max(block.n_begin, min(tiles.n_end, block.n_end));
  const int n_begin = min(max(tiles.n_begin, block.n_begin), n_end);
  return {n_begin, n_end};
}

// Whether no row of the block sees any key (a window left of every key, or no keys at all).
__device__ __forceinline__ bool SeesNoKeys(const FwdBlock& block) {
  return block.n_begin >= block.n_end;
}

// The answer of a block that sees no key: out = 0 and lse = +inf, written by kThreads threads
// (tid among them).
template <int kBlockM, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void WriteKeylessBlock(const FwdKernelArgs& args,
                                                  const FwdCta<Element>& cta, int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  ZeroRows<kBlockM, kRowVecs, kThreads>(cta.out, args.q_row_stride, cta.block.rows_valid,
                                        args.head_dim / kVecElems, tid);
  for (int row = tid; row < cta.block.rows_valid; row += kThreads) cta.lse[row] = INFINITY;
}

// Locates this CTA's (query block = reversed blockIdx.x, head = blockIdx.y, sequence =
// blockIdx.z). Returns false when the CTA has nothing more to do: its block starts past the
// sequence, or no row of it sees any key, in which case it has written out = 0 and lse = +inf.
// Highest query blocks first: under causal masking they carry the most key tiles. (Ordering all
// heads and sequences of one block index together instead, so that long sequences start first
// in varlen batches, measured up to 20% slower on equal lengths: neighbouring CTAs then read
// different K/V and L2 stops serving them; NOTES.md.)
template <int kBlockM, int kBlockN, int kRowVecs, int kThreads, bool kBlocksFromEnd = false,
          typename Element>
__device__ __forceinline__ bool BeginForwardCta(const FwdKernelArgs& args,
                                                FwdCta<Element>& cta) {
  const int m_block = gridDim.x - 1 - blockIdx.x;
  if (!LocateForwardBlock<kBlockM, kBlockN, kBlocksFromEnd>(args, m_block, blockIdx.y,
                                                            blockIdx.z, cta)) {
    return false;
  }
  if (SeesNoKeys(cta.block)) {
    WriteKeylessBlock<kBlockM, kRowVecs, kThreads>(args, cta, threadIdx.x);
    return false;
  }
  return true;
}

}  // namespace attnserve::kernels::flash
