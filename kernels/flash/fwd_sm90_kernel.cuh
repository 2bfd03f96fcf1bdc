// The Hopper (sm_90a) flash forward: FlashAttention-2's algorithm on warpgroup MMA. One CTA per
// (query block, head, sequence) with a warpgroup per 64 rows (two or three). Q and two-stage
// rings of K and V tiles live in shared memory in wgmma's 128-byte-swizzled layout, filled with
// cp.async (zero-fill past the sequence and in the head-dim padding, so varlen needs no tensor
// maps). Per key tile each warpgroup computes S = Q K^T (wgmma, both operands from shared
// memory), masks and runs the online softmax in registers, and adds P V (wgmma, P from
// registers, V N-major from shared memory); the P V of one tile runs under the softmax of the
// next, and the next tiles' K and V land in the other stages. Key tiles are visited last to
// first, with the sm80 kernel's block location (fwd_block.cuh) and row-tile math (masks, online
// softmax: fwd_row_tile.cuh), so both paths see exactly the same keys.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_row_tile.cuh"
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
      const float sum = QuadRowSum(row_sum_[h]);
      const float inv = RowNormalizer(sum);
      const int row = warp * 16 + group + 8 * h;
#pragma unroll
      for (int nt = 0; nt < T::kOTiles; ++nt) {
        const uint32_t packed =
            ptx::PackPair<Element>(o_[nt][2 * h] * inv, o_[nt][2 * h + 1] * inv);
        ptx::StoreShared32(q_smem_ + SwizzledOffset<T::kBlockM>(row, nt) + quad_lane * 4, packed);
      }
      if (quad_lane == 0 && row < block_.rows_valid) {
        lse[row] = RowLse(sum, row_max_[h], args_.lse_scale);
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
    // P(n) as 16-bit A fragments, one per k16 step.
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) PackPStep<Element>(s, kk, p[kk]);
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

  // Masks this warp's 16-row tile (fwd_row_tile.cuh) of key tile n.
  __device__ __forceinline__ void ApplyMask(float (&s)[T::kSTiles][4], int n) {
    const int tid = ptx::FreshThreadIdx();
    const int warp = tid / 32;
    const int group = tid % 32 / 4;
    const int first_col = n * T::kBlockN + 2 * (tid % 4);
    MaskRowTile(s, block_.diagonal + warp * 16 + group, first_col, block_.len_k, args_);
  }

  // Online softmax of this warp's 16-row tile (fwd_row_tile.cuh). Returns whether some row of
  // this thread has a new maximum, with the factors O must be rescaled by (the caller does that
  // once the P V in flight is done).
  __device__ __forceinline__ bool UpdateSoftmax(float (&s)[T::kSTiles][4],
                                                float (&correction)[2]) {
    const float scale = args_.exp2_scale;
    float shift[2];
    bool any_new_max = false;
    UpdateRowMax(s, row_max_, scale, shift, correction, any_new_max);
    ExponentiateRows(s, shift, correction, scale, row_sum_);
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
  extern __shared__ __align__(16) unsigned char smem[];
  FwdCta<Element> cta;
  if (!BeginForwardCta<T::kBlockM, T::kBlockN, T::kRowVecs, T::kThreads>(args, cta)) return;

  // The swizzle pattern comes from address bits: align the tiles to 1024 bytes.
  const uint32_t base = (ptx::SharedAddress(smem) + 1023u) & ~1023u;
  FwdSm90BlockRunner<kDType, kHeadDim> runner(args, cta.block, cta.kv_offset, base);
  runner.Prologue(cta.q);
  runner.Run();
  runner.Epilogue(cta.out, cta.lse);
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
