// What the two Hopper (sm_90a) backward dK/dV kernels share (bwd_sm90_kernel.cuh at head dims
// 64/128, bwd_sm90_wide_kernel.cuh at 192/256): one CTA's key block and the query tiles whose
// rows see it (the sm80 pair kernel's range), K and V resident and Q, dO, lse and D streamed
// through kStages cp.async stages in wgmma's 128-byte swizzle (zero-filled past the sequence),
// the S^T / dP^T and dV / dK products, and the dQ reduction into the float32 workspace.
// T (BwdSm90Traits or BwdSm90WideTraits) gives the geometry; kFlatLoads picks the loader.
#pragma once

#include <cstdint>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/fwd_sm90_kernel.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"

namespace attnserve::kernels::flash {

// Copies kRows rows of kRowVecs 16-byte vectors into a swizzled tile (cp.async; lands by the next
// wait), zero-filling rows at or past rows_valid and vectors at or past vecs_valid (nothing is
// read for them). Unlike LoadSwizzledAsync each thread takes vectors kThreads apart in the flat
// (row, vector) order, so a row of 24 vectors (head dim 192) needs no whole rows per pass.
template <int kRows, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void LoadSwizzledFlatAsync(uint32_t smem, const Element* src,
                                                      int row_stride, int rows_valid,
                                                      int vecs_valid, int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kVecs = kRows * kRowVecs;
  constexpr int kPasses = (kVecs + kThreads - 1) / kThreads;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int idx = tid + i * kThreads;
    if (kVecs % kThreads == 0 || idx < kVecs) {
      const int row = idx / kRowVecs;
      const int vec = idx % kRowVecs;
      ptx::CopyAsync16(smem + SwizzledOffset<kRows>(row, vec),
                       src + row * row_stride + vec * kVecElems,
                       row < rows_valid && vec < vecs_valid);
    }
  }
}

template <class T>
class BwdSm90Block {
 public:
  __device__ __forceinline__ bool Exists() const { return key_first_ < len_k_; }

  // K, V and the first kStages - 1 query tiles, each tile its own group (loads then run
  // kStages - 1 tiles ahead).
  __device__ __forceinline__ void Prologue() {
    if (iters_ > 0) {
      const int tid = threadIdx.x;
      const int64_t kv_offset = (int64_t{k_begin_} + key_first_) * f_.kv_row_stride +
                                int64_t{kv_head_} * f_.head_dim;
      const int kv_stride = static_cast<int>(f_.kv_row_stride);
      LoadRows<T::kBlockN>(k_smem_, static_cast<const Element*>(f_.k) + kv_offset, kv_stride,
                           len_k_ - key_first_, tid);
      LoadRows<T::kBlockN>(v_smem_, static_cast<const Element*>(f_.v) + kv_offset, kv_stride,
                           len_k_ - key_first_, tid);
      LoadStage(0);
    }
    ptx::CommitAsyncGroup<Sm80>();
#pragma unroll
    for (int s = 1; s + 1 < T::kStages; ++s) {
      if (s < iters_) LoadStage(s);
      ptx::CommitAsyncGroup<Sm80>();
    }
  }

 protected:
  using Element = typename T::Element;
  using MmaScores = ptx::Wgmma<Element, T::kBlockM>;  // 64 keys x kBlockM queries
  using MmaGrad = ptx::Wgmma<Element, T::kHeadDim>;   // 64 keys x head dim

  // Shared memory from `smem`: K, V (kKvBytes each), kStages stages, the dS^T tile (the kernel
  // lays out anything after it).
  __device__ __forceinline__ BwdSm90Block(const BwdKernelArgs& args, uint32_t smem, int batch,
                                          int kv_head, int n_block)
      : args_(args), f_(args.fwd), kv_head_(kv_head) {
    k_smem_ = smem;
    v_smem_ = smem + T::kKvBytes;
    stage_smem_ = smem + 2 * T::kKvBytes;
    ds_smem_ = stage_smem_ + T::kStages * T::kStageBytes;
    k_begin_ = f_.cu_seqlens_k[batch];
    len_k_ = f_.cu_seqlens_k[batch + 1] - k_begin_;
    key_first_ = n_block * T::kBlockN;
    q_begin_ = f_.cu_seqlens_q[batch];
    len_q_ = f_.cu_seqlens_q[batch + 1] - q_begin_;
    offset_ = len_k_ - len_q_;  // query row i's diagonal key is i + offset
    vecs_valid_ = f_.head_dim / T::kVecElems;
    // The query tiles whose rows see a key of the block (the sm80 pair kernel's range).
    const int key_last = min(len_k_, key_first_ + T::kBlockN) - 1;
    const int row_first = max(0, key_first_ - f_.window_right - offset_);
    const int row_last = min(len_q_ - 1, key_last + f_.window_left - offset_);
    m_begin_ = row_first / T::kBlockM;
    m_count_ = row_first > row_last ? 0 : row_last / T::kBlockM - m_begin_ + 1;
    iters_ = m_count_ * f_.head_group;
  }

  __device__ __forceinline__ uint32_t StageSmem(int it) const {
    return stage_smem_ + (it % T::kStages) * T::kStageBytes;
  }
  __device__ __forceinline__ int HeadOf(int it) const {
    return kv_head_ * f_.head_group + it / m_count_;
  }
  __device__ __forceinline__ int Row0Of(int it) const {
    return (m_begin_ + it % m_count_) * T::kBlockM;
  }

  // Q, dO, lse and D of query tile `it` into its stage. Rows past the sequence read 0 (their Q
  // and dO are 0, so they contribute exactly nothing, and their dQ is never stored).
  __device__ __forceinline__ void LoadStage(int it) {
    const int tid = ptx::FreshThreadIdx();
    const int head = HeadOf(it);
    const int row0 = Row0Of(it);
    const uint32_t st = StageSmem(it);
    const int64_t q_offset = (int64_t{q_begin_} + row0) * f_.q_row_stride +
                             int64_t{head} * f_.head_dim;
    const int q_stride = static_cast<int>(f_.q_row_stride);
    LoadRows<T::kBlockM>(st, static_cast<const Element*>(f_.q) + q_offset, q_stride,
                         len_q_ - row0, tid);
    LoadRows<T::kBlockM>(st + T::kTileBytes, static_cast<const Element*>(args_.dout) + q_offset,
                         q_stride, len_q_ - row0, tid);
    if (tid < 2 * T::kBlockM) {
      const int row = row0 + tid % T::kBlockM;
      const float* src = tid < T::kBlockM ? f_.lse : args_.dsum;
      const int64_t index = int64_t{head} * f_.total_q + q_begin_ + row;
      ptx::CopyAsync4<Sm80>(st + 2 * T::kTileBytes + tid * 4, src + (row < len_q_ ? index : 0),
                            row < len_q_);
    }
  }

  // S^T = K Q^T (or dP^T = V dO^T) for this warpgroup's 64 keys, one committed group (the caller
  // fences first): both K-major, the k16 step kk in head-dim block kk / 4 at 32 bytes per step.
  __device__ __forceinline__ void IssueScores(float (&acc)[T::kSTiles][4], uint32_t keys,
                                              uint32_t queries) {
#pragma unroll
    for (int kk = 0; kk < T::kScoreSteps; ++kk) {
      const uint32_t step = (kk % 4) * 32;
      const uint64_t a =
          ptx::MatrixDescriptor128B(keys + (kk / 4) * T::kBlockN * 128 + step, 16, 1024);
      const uint64_t b =
          ptx::MatrixDescriptor128B(queries + (kk / 4) * T::kBlockM * 128 + step, 16, 1024);
      MmaScores::SS(acc, a, b, kk > 0);
    }
    ptx::WgmmaCommit();
  }

  // acc += A (P^T or dS^T fragments) x B (dO or Q: the N-major operand, 64 head-dim columns per
  // 128-byte row, query rows 128 bytes apart, head-dim blocks kBlockM * 128 bytes apart), one
  // committed group (the caller fences first).
  __device__ __forceinline__ void IssueGrad(float (&acc)[T::kDTiles][4],
                                            const uint32_t (&a)[T::kGradSteps][4],
                                            uint32_t rows) {
#pragma unroll
    for (int kk = 0; kk < T::kGradSteps; ++kk) {
      const uint64_t b = ptx::MatrixDescriptor128B(rows + kk * 16 * 128, T::kBlockM * 128, 1024);
      MmaGrad::RS(acc, a[kk], b, 1);
    }
    ptx::WgmmaCommit();
  }

  // Adds a dQ product into the float32 workspace: lanes 2j, 2j+1 of a quad swap halves (one
  // shuffle per pair) so each adds 4 consecutive columns of one row with one v4 reduction per
  // 8-column tile (the sm80 kernel's scheme).
  template <int kTiles>
  __device__ __forceinline__ void AddDq(const float (&dq)[kTiles][4], int it, int row, int col0,
                                        bool odd) {
    const int row0 = Row0Of(it);
    const int q_row = row + (odd ? 8 : 0);
    float* dst = args_.dq_accum + (int64_t{q_begin_} + row0 + q_row) * f_.q_row_stride +
                 int64_t{HeadOf(it)} * f_.head_dim;
    const bool row_valid = q_row < len_q_ - row0;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const float y0 = __shfl_xor_sync(0xffffffffu, odd ? dq[t][0] : dq[t][2], 1);
      const float y1 = __shfl_xor_sync(0xffffffffu, odd ? dq[t][1] : dq[t][3], 1);
      const int col = col0 + t * 8;
      if (row_valid && col < f_.head_dim) {
        if (odd) {
          ptx::AtomicAddQuad(dst + col, y0, y1, dq[t][2], dq[t][3]);
        } else {
          ptx::AtomicAddQuad(dst + col, dq[t][0], dq[t][1], y0, y1);
        }
      }
    }
  }

  const BwdKernelArgs& args_;
  const FwdKernelArgs& f_;
  int kv_head_;
  int k_begin_, len_k_, key_first_, q_begin_, len_q_, offset_;
  int vecs_valid_;
  int m_begin_, m_count_, iters_;
  uint32_t k_smem_, v_smem_, stage_smem_, ds_smem_;

 private:
  template <int kRows>
  __device__ __forceinline__ void LoadRows(uint32_t smem, const Element* src, int row_stride,
                                           int rows_valid, int tid) {
    if constexpr (T::kFlatLoads) {
      LoadSwizzledFlatAsync<kRows, T::kRowVecs, T::kThreads>(smem, src, row_stride, rows_valid,
                                                              vecs_valid_, tid);
    } else {
      LoadSwizzledAsync<kRows, T::kRowVecs, T::kThreads>(smem, src, row_stride, rows_valid,
                                                          vecs_valid_, tid);
    }
  }
};

}  // namespace attnserve::kernels::flash
