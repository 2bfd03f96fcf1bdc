// The flash forward kernel (FlashAttention-2's algorithm on mma.sync), for either code path
// (arch.h): one CTA per (query block, head, sequence). Q stays in shared memory; K and V tiles
// go through one buffer each, V(n) loading under S = Q K(n)^T and K(n-1) under softmax and P V(n)
// (cp.async on Sm80; on Sm75 the register-staged loads complete before the math, and other CTAs
// on the SM cover their latency). Key tiles are visited last to first, so the masked diagonal
// tiles come first; tiles no row sees are never loaded, and only tiles crossing a mask edge pay
// for per-element masking. S, P and O stay in registers; P is rounded to 16 bits in place to
// become the A operand of P V.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/flash/extras_args.h"
#include "kernels/flash/extras_tile.cuh"
#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_row_tile.cuh"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// kExtras: dropout and ALiBi (extras_tile.cuh), compiled in only where set, so the plain
// instantiation is unchanged.
template <class Arch, DType kDType, int kHeadDim, bool kExtras = false>
class FwdBlockRunner {
  using T = FwdTraits<Arch, kDType, kHeadDim>;
  using Element = typename T::Element;
  using Args = FwdArgsOf<kExtras>;

 public:
  __device__ __forceinline__ FwdBlockRunner(const Args& args, const FwdBlock& block,
                                            int64_t kv_offset, unsigned char* smem)
      : args_(args), block_(block), kv_offset_(kv_offset) {
    tid_ = threadIdx.x;
    warp_ = tid_ / 32;
    lane_ = tid_ % 32;
    q_smem_ = ptx::SharedAddress(smem);
    k_smem_ = q_smem_ + T::kQSmemBytes;
    v_smem_ = k_smem_ + T::kKvSmemBytes;
    // ldmatrix row addresses. Q (A operand): lanes 0-7 rows 0-7, 8-15 rows 8-15, 16-31 again
    // at column 8. K (B operand, two 8-key tiles): lanes 0-7 keys 0-7, 8-15 the same keys at
    // column 8, 16-31 keys 8-15. V (B operand, transposed): lanes 0-15 keys 0-15, 16-31 the
    // same keys at column 8.
    const int r8 = lane_ % 8;
    const int half = (lane_ / 8) % 2;
    const int upper = lane_ / 16;
    q_frag_ = q_smem_ + (warp_ * T::kWarpRows + r8 + half * 8) * T::kSmemRowBytes + upper * 16;
    k_frag_ = k_smem_ + (r8 + upper * 8) * T::kSmemRowBytes + half * 16;
    v_frag_ = v_smem_ + (r8 + half * 8) * T::kSmemRowBytes + upper * 16;
    vecs_valid_ = args.head_dim / T::kVecElems;
    if constexpr (kExtras) {
      // The CTA's (sequence, head): blockIdx.z, blockIdx.y (BeginForwardCta).
      slope_ = AlibiSlopePre(args.x, blockIdx.z, blockIdx.y);
    }
  }

  // Loads Q and the last key tile; call once before Run.
  __device__ __forceinline__ void Prologue(const Element* q) {
    LoadRowsAsync<Arch, T::kBlockM, T::kRowVecs, T::kSmemRowBytes, T::kThreads>(
        q_smem_, q, static_cast<int>(args_.q_row_stride), block_.rows_valid, vecs_valid_, tid_);
    LoadKeyTile(k_smem_, args_.k, block_.n_end - 1);
    ptx::CommitAsyncGroup<Arch>();
  }

  __device__ __forceinline__ void Run() {
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max_[mt][h] = -INFINITY;
        row_sum_[mt][h] = 0.0f;
      }
#pragma unroll
      for (int nt = 0; nt < T::kOTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o_[mt][nt][e] = 0.0f;
      }
    }
    for (int n = block_.n_end - 1; n >= block_.n_begin; --n) {
      if (n >= block_.mask_from || n < block_.mask_below) {
        Step<true>(n);
      } else {
        Step<false>(n);
      }
    }
  }

  // Normalizes O, writes this warp's rows of out (through its own rows of the Q buffer, which
  // only this warp ever read) and their lse.
  __device__ __forceinline__ void Epilogue(Element* out, float* lse) {
    const int group = lane_ / 4;
    const int quad_lane = lane_ % 4;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = QuadRowSum(row_sum_[mt][h]);
        float inv = RowNormalizer(sum);
        if constexpr (kExtras) inv *= args_.x.dropout_scale;  // kept P: times 1 / (1 - p)
        const int row = warp_ * T::kWarpRows + mt * T::kMmaM + group + 8 * h;
#pragma unroll
        for (int nt = 0; nt < T::kOTiles; ++nt) {
          const uint32_t packed =
              ptx::PackPair<Element>(o_[mt][nt][2 * h] * inv, o_[mt][nt][2 * h + 1] * inv);
          ptx::StoreShared32(
              q_smem_ + row * T::kSmemRowBytes + (nt * T::kMmaN + 2 * quad_lane) * 2, packed);
        }
        if (quad_lane == 0 && row < block_.rows_valid) {
          lse[row] = RowLse(sum, row_max_[mt][h], args_.lse_scale);
        }
      }
    }
    __syncwarp();
    const int warp_row = warp_ * T::kWarpRows;
    StoreRows<T::kWarpRows, T::kRowVecs, T::kSmemRowBytes, 32>(
        out + warp_row * args_.q_row_stride, args_.q_row_stride,
        q_smem_ + warp_row * T::kSmemRowBytes, block_.rows_valid - warp_row, vecs_valid_, lane_);
  }

 private:
  // K or V rows [n * kBlockN, (n + 1) * kBlockN) of this block's sequence and kv head. The
  // tensor base comes from the kernel arguments each time, so only one 64-bit offset (shared by
  // K and V) occupies registers across the main loop.
  __device__ __forceinline__ void LoadKeyTile(uint32_t smem, const void* tensor, int n) {
    const int first_key = n * T::kBlockN;
    const Element* src = static_cast<const Element*>(tensor) + kv_offset_ +
                         int64_t{first_key} * args_.kv_row_stride;
    LoadRowsAsync<Arch, T::kBlockN, T::kRowVecs, T::kSmemRowBytes, T::kThreads>(
        smem, src, static_cast<int>(args_.kv_row_stride), block_.len_k - first_key, vecs_valid_,
        ptx::FreshThreadIdx());
  }

  // One key tile: S = Q K(n)^T, softcap, mask, online softmax, O += P V(n).
  template <bool kMask>
  __device__ __forceinline__ void Step(int n) {
    float s[T::kMTiles][T::kSTiles][4];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      }
    }
    // K(n) has landed, and every warp is done with V(n+1): refill V.
    ptx::WaitAsyncGroups<Arch, 0>();
    __syncthreads();
    LoadKeyTile(v_smem_, args_.v, n);
    ptx::CommitAsyncGroup<Arch>();

    ComputeScores(s);
    if (args_.softcap) {
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nt][e] = ptx::Tanh(s[mt][nt][e] * args_.softcap_input_scale);
          }
        }
      }
    }
    if constexpr (kExtras) {
      if (args_.x.alibi_slopes != nullptr) ApplyAlibi(s, n);  // after softcap, before masks
    }
    if constexpr (kMask) ApplyMask(s, n);

    // V(n) has landed, and every warp is done with K(n): prefetch K(n-1).
    ptx::WaitAsyncGroups<Arch, 0>();
    __syncthreads();
    if (n > block_.n_begin) {
      LoadKeyTile(k_smem_, args_.k, n - 1);
      ptx::CommitAsyncGroup<Arch>();
    }

    UpdateSoftmax(s);  // row maxima and sums (so lse) of the undropped P
    if constexpr (kExtras) {
      if (args_.x.dropout) ApplyDropout(s, n);
    }
    AccumulatePV(s);
  }

  // This thread's first row (of row tile 0) within the sequence, its row tile mt's diagonal key
  // and its first key column of tile n.
  __device__ __forceinline__ int ThreadRow(int tid) const {
    return block_.row_first + (tid / 32) * T::kWarpRows + tid % 32 / 4;
  }
  __device__ __forceinline__ int FirstCol(int tid, int n) const {
    return n * T::kBlockN + 2 * (tid % 4);
  }

  // s -= slope * |i + len_k - len_q - j| (extras_tile.cuh).
  __device__ __forceinline__ void ApplyAlibi(float (&s)[T::kMTiles][T::kSTiles][4], int n) {
    const int tid = ptx::FreshThreadIdx();
    // The key on this thread's row's diagonal: row + len_k - len_q.
    const int aligned = block_.diagonal + ThreadRow(tid) - block_.row_first;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      AlibiRowTile(s[mt], slope_, aligned + mt * T::kMmaM, FirstCol(tid, n));
    }
  }

  // P -> P * Z (the 1 / (1 - p) of kept entries is folded into the epilogue's normalizer).
  __device__ __forceinline__ void ApplyDropout(float (&p)[T::kMTiles][T::kSTiles][4], int n) {
    const int tid = ptx::FreshThreadIdx();
    const uint32_t sequence = static_cast<uint32_t>(args_.x.first_sequence) + blockIdx.z;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      DropoutRowTile(p[mt], args_.x, sequence, blockIdx.y, ThreadRow(tid) + mt * T::kMmaM,
                     FirstCol(tid, n), 1.0f);
    }
  }

  __device__ __forceinline__ void ComputeScores(float (&s)[T::kMTiles][T::kSTiles][4]) {
#pragma unroll
    for (int kk = 0; kk < T::kQkSteps; ++kk) {
      uint32_t a[T::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
        ptx::LoadMatrixX4(a[mt], q_frag_ + mt * T::kMmaM * T::kSmemRowBytes + kk * T::kMmaK * 2);
      }
#pragma unroll
      for (int np = 0; np < T::kSTiles / 2; ++np) {
        uint32_t b[4];
        ptx::LoadMatrixX4(b, k_frag_ + np * 2 * T::kMmaN * T::kSmemRowBytes + kk * T::kMmaK * 2);
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt) {
          ptx::Mma16816<Arch, Element>(s[mt][2 * np], a[mt], b[0], b[1]);
          ptx::Mma16816<Arch, Element>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // Masks each row tile (fwd_row_tile.cuh) of key tile n.
  __device__ __forceinline__ void ApplyMask(float (&s)[T::kMTiles][T::kSTiles][4], int n) {
    const int tid = ptx::FreshThreadIdx();
    const int warp = tid / 32;
    const int group = tid % 32 / 4;
    const int first_col = n * T::kBlockN + 2 * (tid % 4);
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      MaskRowTile(s[mt], block_.diagonal + warp * T::kWarpRows + mt * T::kMmaM + group,
                  first_col, block_.len_k, args_);
    }
  }

  // Online softmax (fwd_row_tile.cuh): new row maxima, rescale O and the running sums, and
  // turn S into unnormalized probabilities in place. O is rescaled only when some row of the
  // warp has a new maximum (exact: otherwise every factor is 1), which after the first few
  // tiles is rare.
  __device__ __forceinline__ void UpdateSoftmax(float (&s)[T::kMTiles][T::kSTiles][4]) {
    const float scale = args_.exp2_scale;
    float shift[T::kMTiles][2];
    float correction[T::kMTiles][2];
    bool any_new_max = false;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      UpdateRowMax(s[mt], row_max_[mt], scale, shift[mt], correction[mt], any_new_max);
    }
    if (__any_sync(0xffffffffu, any_new_max)) {
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < T::kOTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o_[mt][nt][e] *= correction[mt][e / 2];
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
      ExponentiateRows(s[mt], shift[mt], correction[mt], scale, row_sum_[mt]);
    }
  }

  // O += P V, P packed per k16 step (PackPStep).
  __device__ __forceinline__ void AccumulatePV(const float (&p)[T::kMTiles][T::kSTiles][4]) {
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) {
      uint32_t a[T::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) PackPStep<Element>(p[mt], kk, a[mt]);
#pragma unroll
      for (int dp = 0; dp < T::kOTiles / 2; ++dp) {
        uint32_t b[4];
        ptx::LoadMatrixX4Trans(
            b, v_frag_ + kk * T::kMmaK * T::kSmemRowBytes + dp * 2 * T::kMmaN * 2);
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt) {
          ptx::Mma16816<Arch, Element>(o_[mt][2 * dp], a[mt], b[0], b[1]);
          ptx::Mma16816<Arch, Element>(o_[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  const Args& args_;
  const FwdBlock& block_;
  float slope_;  // ALiBi slope in pre-score units (kExtras only)
  int64_t kv_offset_;  // elements from the K/V base to this sequence's first row, this kv head
  int tid_, warp_, lane_, vecs_valid_;
  uint32_t q_smem_, k_smem_, v_smem_;
  uint32_t q_frag_, k_frag_, v_frag_;
  // Per thread: rows (group, group + 8) of each row tile; O columns 2 * quad_lane + {0, 1}.
  float o_[T::kMTiles][T::kOTiles][4];
  float row_max_[T::kMTiles][2];
  float row_sum_[T::kMTiles][2];
};

// One CTA's work; the kernel below is this, or a trap where the path's instructions do not exist.
template <class Arch, DType kDType, int kHeadDim, bool kExtras>
__device__ __forceinline__ void FlashForwardCta(const FwdArgsOf<kExtras>& args) {
  using T = FwdTraits<Arch, kDType, kHeadDim>;
  using Element = typename T::Element;
  extern __shared__ __align__(16) unsigned char smem[];
  FwdCta<Element> cta;
  if (!BeginForwardCta<T::kBlockM, T::kBlockN, T::kRowVecs, T::kThreads>(args, cta)) return;
  FwdBlockRunner<Arch, kDType, kHeadDim, kExtras> runner(args, cta.block, cta.kv_offset, smem);
  runner.Prologue(cta.q);
  runner.Run();
  runner.Epilogue(cta.out, cta.lse);
}

template <class Arch, DType kDType, int kHeadDim, bool kExtras = false>
__global__ void __launch_bounds__(FwdTraits<Arch, kDType, kHeadDim>::kThreads)
    FlashForwardKernel(const __grid_constant__ FwdArgsOf<kExtras> args) {
  if constexpr (kArchBodyCompiled<Arch>) {
    FlashForwardCta<Arch, kDType, kHeadDim, kExtras>(args);
  } else {
    __trap();  // an sm80 kernel in an sm_75 binary: never launched there
  }
}

}  // namespace attnserve::kernels::flash
