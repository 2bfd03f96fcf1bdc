// The Hopper (sm_90a) flash forward: FlashAttention-2's algorithm on warpgroup MMA. One CTA per
// (query block, head, sequence) with a warpgroup per 64 rows (two or three). Q and two-stage
// rings of K and V tiles live in shared memory in wgmma's 128-byte-swizzled layout, filled with
// cp.async (zero-fill past the sequence and in the head-dim padding, so varlen needs no tensor
// maps). Per key tile each warpgroup computes S = Q K^T (wgmma, both operands from shared
// memory), masks and runs the online softmax in registers, and adds P V (wgmma, P from
// registers, V N-major from shared memory); the P V of one tile runs under the softmax of the
// next, and the next tiles' K and V land in the other stages. Key tiles are visited last to
// first, with the sm80 kernel's block location and masking rules (fwd_kernel.cuh), so both
// paths see exactly the same keys.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_kernel.cuh"
#include "kernels/flash/fwd_sm90_traits.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"

namespace attnserve::kernels::flash {

// Byte offset of 16-byte vector `vec` of row `row` in a tile of kRows rows stored as
// head-dim blocks of 64 elements (kRows x 128 bytes each), 128-byte swizzled: vector v of a row
// sits at v ^ (row % 8) within its 128-byte line.
template <int kRows>
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int vec) {
  return (vec / 8) * (kRows * 128) + row * 128 + (((vec % 8) ^ (row % 8)) * 16);
}

// Copies kRows rows of kRowVecs 16-byte vectors into a swizzled tile (cp.async; lands by the next
// wait). Rows at or past rows_valid and vectors at or past vecs_valid are zero-filled, never
// read. Every pass covers whole rows, a multiple of 8, so each thread's swizzle is fixed; the
// last pass may cover fewer than kThreads / kRowVecs rows (384 threads, 128-row K/V tiles).
template <int kRows, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void LoadSwizzledAsync(uint32_t smem, const Element* src,
                                                  int row_stride, int rows_valid, int vecs_valid,
                                                  int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kRowsPerPass = kThreads / kRowVecs;
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kThreads % kRowVecs == 0 && kRowsPerPass % 8 == 0,
                "whole rows per pass, a multiple of the 8-row swizzle period");
  const int row0 = tid / kRowVecs;
  const int vec = tid % kRowVecs;
  const int rows_left = rows_valid - row0;
  const bool vec_valid = vec < vecs_valid;
  const uint32_t smem0 = smem + SwizzledOffset<kRows>(row0, vec);
  const Element* from = src + row0 * row_stride + vec * kVecElems;
  const int pass_stride = kRowsPerPass * row_stride;
#pragma unroll
  for (int it = 0; it < kPasses; ++it) {
    if (kRows % kRowsPerPass == 0 || it < kPasses - 1 || row0 < kRows - it * kRowsPerPass) {
      ptx::CopyAsync16(smem0 + it * kRowsPerPass * 128, from,
                       vec_valid && it * kRowsPerPass < rows_left);
    }
    from = ptx::Advance(from, pass_stride);
  }
}

template <DType kDType, int kHeadDim>
class FwdSm90BlockRunner {
  using T = FwdSm90Traits<kDType, kHeadDim>;
  using Element = typename T::Element;
  using Mma = ptx::Wgmma<Element, T::kBlockN>;    // S = Q K^T: 64 x kBlockN per warpgroup
  using MmaPv = ptx::Wgmma<Element, kHeadDim>;    // O += P V: 64 x kHeadDim per warpgroup

 public:
  __device__ __forceinline__ FwdSm90BlockRunner(const FwdKernelArgs& args, const FwdBlock& block,
                                                int64_t kv_offset, uint32_t smem)
      : args_(args), block_(block), kv_offset_(kv_offset) {
    q_smem_ = smem;
    kv_smem_ = smem + T::kQSmemBytes;
    vecs_valid_ = args.head_dim / T::kVecElems;
  }

  // Loads Q and the last tile's K (the first iteration loads its V).
  __device__ __forceinline__ void Prologue(const Element* q) {
    const int tid = threadIdx.x;
    LoadSwizzledAsync<T::kBlockM, T::kRowVecs, T::kThreads>(
        q_smem_, q, static_cast<int>(args_.q_row_stride), block_.rows_valid, vecs_valid_, tid);
    LoadKeyTile(KSmem(block_.n_end - 1), args_.k, block_.n_end - 1);
    ptx::CommitAsyncGroup<Sm80>();
  }

  // Software-pipelined over key tiles (FlashAttention-3's intra-warpgroup overlap): iteration n
  // issues S(n) = Q K(n)^T and then O += P(n+1) V(n+1) on the tensor cores, waits for S(n)
  // only, and runs the softmax of tile n while P V still runs; O is rescaled once P V is done.
  // The copies run one iteration ahead: iteration n loads K(n-1) and V(n), each into stage
  // (tile % 2), whose previous tiles (K(n+1), V(n+2)) every warpgroup finished reading in
  // iteration n+1, before this iteration's barrier.
  __device__ __forceinline__ void Run() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max_[h] = -INFINITY;
      row_sum_[h] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < T::kOTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_[nt][e] = 0.0f;
    }
    uint32_t p[T::kPvSteps][4];  // P(n+1), the A operand of the P V in flight
    // The last tile (no P V before it) is peeled off, so that whether a P V is in flight is
    // known at compile time everywhere: with a run-time flag ptxas cannot prove that O is not
    // rescaled under a running P V and serializes every wgmma (C7515).
    const int last = block_.n_end - 1;
    if (last >= block_.mask_from || last < block_.mask_below) {
      Step<true, false>(last, p);
    } else {
      Step<false, false>(last, p);
    }
    for (int n = last - 1; n >= block_.n_begin; --n) {
      if (n >= block_.mask_from || n < block_.mask_below) {
        Step<true, true>(n, p);
      } else {
        Step<false, true>(n, p);
      }
    }
    // The first tile's P V (its V was loaded in the last iteration).
    ptx::WaitAsyncGroups<Sm80, 0>();
    ptx::FenceProxyAsyncShared();
    __syncthreads();
    ptx::WgmmaFence();
    IssuePV(p, block_.n_begin);
    ptx::WgmmaWait<0>(o_);
  }

  // Normalizes O, writes each warp's 16 rows through its own rows of the Q buffer (no wgmma
  // reads them any more) with 16-byte stores, and their lse.
  __device__ __forceinline__ void Epilogue(Element* out, float* lse) {
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int group = lane / 4;
    const int quad_lane = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum_[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // A row that saw no key has sum 0: out 0, lse +inf (NaN inputs stay NaN).
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      const int row = warp * 16 + group + 8 * h;
#pragma unroll
      for (int nt = 0; nt < T::kOTiles; ++nt) {
        const uint32_t packed =
            ptx::PackPair<Element>(o_[nt][2 * h] * inv, o_[nt][2 * h + 1] * inv);
        ptx::StoreShared32(q_smem_ + SwizzledOffset<T::kBlockM>(row, nt) + quad_lane * 4, packed);
      }
      if (quad_lane == 0 && row < block_.rows_valid) {
        lse[row] = sum == 0.0f ? INFINITY : row_max_[h] * args_.lse_scale + logf(sum);
      }
    }
    __syncwarp();
    constexpr int kPerLane = 16 * T::kRowVecs / 32;
#pragma unroll
    for (int it = 0; it < kPerLane; ++it) {
      const int idx = it * 32 + lane;
      const int row = warp * 16 + idx / T::kRowVecs;
      const int vec = idx % T::kRowVecs;
      if (row < block_.rows_valid && vec < vecs_valid_) {
        const uint4 value = ptx::LoadShared128(q_smem_ + SwizzledOffset<T::kBlockM>(row, vec));
        *reinterpret_cast<uint4*>(out + row * args_.q_row_stride + vec * T::kVecElems) = value;
      }
    }
  }

 private:
  // K(n) and V(n) live in stage n % 2 of their rings.
  __device__ __forceinline__ uint32_t KSmem(int n) const {
    return kv_smem_ + (n % 2) * T::kKvSmemBytes;
  }
  __device__ __forceinline__ uint32_t VSmem(int n) const {
    return kv_smem_ + (2 + n % 2) * T::kKvSmemBytes;
  }

  // K or V rows [n * kBlockN, (n + 1) * kBlockN) of this block's sequence and kv head. The
  // tensor base comes from the kernel arguments each time (one 64-bit offset in registers).
  __device__ __forceinline__ void LoadKeyTile(uint32_t smem, const void* tensor, int n) {
    const int first_key = n * T::kBlockN;
    const Element* src = static_cast<const Element*>(tensor) + kv_offset_ +
                         int64_t{first_key} * args_.kv_row_stride;
    LoadSwizzledAsync<T::kBlockN, T::kRowVecs, T::kThreads>(
        smem, src, static_cast<int>(args_.kv_row_stride), block_.len_k - first_key, vecs_valid_,
        ptx::FreshThreadIdx());
  }

  // Key tile n: S(n) and (unless n is the last tile) P(n+1) V(n+1) on the tensor cores, the
  // softmax of S(n) under the P V, then O rescaled and P(n) packed for the next iteration.
  template <bool kMask, bool kPv>
  __device__ __forceinline__ void Step(int n, uint32_t (&p)[T::kPvSteps][4]) {
    // K(n) and V(n+1) have landed (visible to the tensor cores), and every warpgroup is done
    // with K(n+1) and V(n+2), whose stages now take K(n-1) and V(n).
    ptx::WaitAsyncGroups<Sm80, 0>();
    ptx::FenceProxyAsyncShared();
    __syncthreads();
    if (n > block_.n_begin) LoadKeyTile(KSmem(n - 1), args_.k, n - 1);
    LoadKeyTile(VSmem(n), args_.v, n);
    ptx::CommitAsyncGroup<Sm80>();

    float s[T::kSTiles][4];
    ptx::WgmmaFence();
    IssueScores(s, n);
    if constexpr (kPv) {
      IssuePV(p, n + 1);
      ptx::WgmmaWait<1>(s);
    } else {
      ptx::WgmmaWait<0>(s);
    }
    if (args_.softcap) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = ptx::Tanh(s[nt][e] * args_.softcap_input_scale);
      }
    }
    if constexpr (kMask) ApplyMask(s, n);
    float correction[2];
    const bool any_new_max = UpdateSoftmax(s, correction);
    if constexpr (kPv) ptx::WgmmaWait<0>(o_);
    if (__any_sync(0xffffffffu, any_new_max)) {
#pragma unroll
      for (int nt = 0; nt < T::kOTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o_[nt][e] *= correction[e / 2];
      }
    }
    // P(n) as 16-bit pairs: the accumulator layout of two 8-key S tiles is the A fragment of one
    // k16 step.
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) {
      p[kk][0] = ptx::PackPair<Element>(s[2 * kk][0], s[2 * kk][1]);
      p[kk][1] = ptx::PackPair<Element>(s[2 * kk][2], s[2 * kk][3]);
      p[kk][2] = ptx::PackPair<Element>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      p[kk][3] = ptx::PackPair<Element>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }

  // S = Q K(n)^T, one committed group (the caller fences first).
  __device__ __forceinline__ void IssueScores(float (&s)[T::kSTiles][4], int n) {
    const int warpgroup = ptx::FreshThreadIdx() / 128;
    const uint32_t q = q_smem_ + warpgroup * 64 * 128;
    const uint32_t k = KSmem(n);
#pragma unroll
    for (int kk = 0; kk < T::kQkSteps; ++kk) {
      // k16 step kk: head-dim block kk / 4, 32 bytes per step inside its 128-byte rows.
      const uint32_t step = (kk % 4) * 32;
      const uint64_t a = ptx::MatrixDescriptor128B(q + (kk / 4) * T::kBlockM * 128 + step, 16,
                                                   1024);
      const uint64_t b = ptx::MatrixDescriptor128B(k + (kk / 4) * T::kBlockN * 128 + step, 16,
                                                   1024);
      Mma::SS(s, a, b, kk > 0);
    }
    ptx::WgmmaCommit();
  }

  // O += P V(n), one committed group (the caller fences first). V is the N-major B operand: 64
  // head-dim columns per 128-byte row, key rows 128 bytes apart, head-dim blocks kBlockN * 128
  // bytes apart.
  __device__ __forceinline__ void IssuePV(const uint32_t (&p)[T::kPvSteps][4], int n) {
    const uint32_t v = VSmem(n);
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) {
      const uint64_t b = ptx::MatrixDescriptor128B(v + kk * 16 * 128, T::kBlockN * 128, 1024);
      MmaPv::RS(o_, p[kk], b, 1);
    }
    ptx::WgmmaCommit();
  }

  // Hides the keys each row must not see (past the end, outside the window) with -inf, bounds
  // relative to this thread's first column (as the sm80 kernel does).
  __device__ __forceinline__ void ApplyMask(float (&s)[T::kSTiles][4], int n) {
    const int tid = ptx::FreshThreadIdx();
    const int warp = tid / 32;
    const int group = tid % 32 / 4;
    const int first_col = n * T::kBlockN + 2 * (tid % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int aligned = block_.diagonal + warp * 16 + group + 8 * h;
      const int last = min(aligned + args_.window_right, block_.len_k - 1) - first_col;
      const int first = aligned - args_.window_left - first_col;
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = nt * 8 + e;
          if (col > last || col < first) s[nt][2 * h + e] = -INFINITY;
        }
      }
    }
  }

  // Online softmax over the quad's rows (the sm80 kernel's, for one 16-row tile per warp): new
  // row maxima, S turned into exp2((s - max) * exp2_scale) in place, running sums rescaled.
  // Returns whether some row of this thread has a new maximum, with the factors O must be
  // rescaled by (the caller does that once the P V in flight is done).
  __device__ __forceinline__ bool UpdateSoftmax(float (&s)[T::kSTiles][4],
                                                float (&correction)[2]) {
    const float scale = args_.exp2_scale;
    float shift[2];
    bool any_new_max = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max_[h];
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
        mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      any_new_max |= mx != row_max_[h];
      // A row with nothing visible so far keeps max -inf; subtract 0 so that exp2(-inf - -inf)
      // never turns into NaN.
      shift[h] = mx == -INFINITY ? 0.0f : mx * scale;
      correction[h] = ptx::Exp2(row_max_[h] * scale - shift[h]);
      row_max_[h] = mx;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = ptx::Exp2(fmaf(s[nt][2 * h + e], scale, -shift[h]));
          s[nt][2 * h + e] = p;
          sum += p;
        }
      }
      row_sum_[h] = row_sum_[h] * correction[h] + sum;
    }
    return any_new_max;
  }

  const FwdKernelArgs& args_;
  const FwdBlock& block_;
  int64_t kv_offset_;  // elements from the K/V base to this sequence's first row, this kv head
  int vecs_valid_;
  uint32_t q_smem_, kv_smem_;
  // Per thread: rows (group, group + 8) of its warp's 16; O columns 8 nt + 2 quad_lane + {0, 1}.
  float o_[T::kOTiles][4];
  float row_max_[2];
  float row_sum_[2];
};

template <DType kDType, int kHeadDim>
__device__ __forceinline__ void FlashForwardSm90Cta(const FwdKernelArgs& args) {
  using T = FwdSm90Traits<kDType, kHeadDim>;
  using Element = typename T::Element;
  extern __shared__ __align__(1024) unsigned char smem[];

  // Highest query blocks first: under causal masking they carry the most key tiles. (Ordering
  // all heads and sequences of one block index together instead, so that long sequences start
  // first in varlen batches, measured up to 20% slower on equal lengths: neighbouring CTAs then
  // read different K/V and L2 stops serving them; NOTES.md.)
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int q_begin = args.cu_seqlens_q[batch];
  const int len_q = args.cu_seqlens_q[batch + 1] - q_begin;
  if (m_block * T::kBlockM >= len_q) return;
  const int k_begin = args.cu_seqlens_k[batch];
  const int len_k = args.cu_seqlens_k[batch + 1] - k_begin;
  const FwdBlock block = LocateBlock<T::kBlockM, T::kBlockN>(args, m_block, len_q, len_k);

  const int64_t first_row = int64_t{q_begin} + block.row_first;
  const int64_t head_offset = int64_t{head} * args.head_dim;
  const int64_t kv_head_offset = int64_t{head / args.head_group} * args.head_dim;
  const Element* q = static_cast<const Element*>(args.q) + first_row * args.q_row_stride +
                     head_offset;
  Element* out = static_cast<Element*>(args.out) + first_row * args.q_row_stride + head_offset;
  float* lse = args.lse + head * args.total_q + first_row;

  if (block.n_begin >= block.n_end) {
    // No row of this block sees any key: out = 0, lse = +inf.
    ZeroRows<T::kBlockM, T::kRowVecs, T::kThreads>(out, args.q_row_stride, block.rows_valid,
                                                     args.head_dim / T::kVecElems, threadIdx.x);
    for (int row = threadIdx.x; row < block.rows_valid; row += T::kThreads) {
      lse[row] = INFINITY;
    }
    return;
  }

  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const uint32_t base = (ptx::SharedAddress(smem) + 1023u) & ~1023u;
  const int64_t kv_offset = int64_t{k_begin} * args.kv_row_stride + kv_head_offset;
  FwdSm90BlockRunner<kDType, kHeadDim> runner(args, block, kv_offset, base);
  runner.Prologue(q);
  runner.Run();
  runner.Epilogue(out, lse);
}

// Compiled only in sm_90a code (the instantiation files are built for that target alone); any
// other pass sees a trap, never launched.
template <DType kDType, int kHeadDim>
__global__ void __launch_bounds__(FwdSm90Traits<kDType, kHeadDim>::kThreads, 1)
    FlashForwardSm90Kernel(const __grid_constant__ FwdKernelArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FlashForwardSm90Cta<kDType, kHeadDim>(args);
#else
  __trap();
#endif
}

}  // namespace attnserve::kernels::flash
