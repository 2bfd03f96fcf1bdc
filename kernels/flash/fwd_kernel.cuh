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

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_tile_io.cuh"
#include "kernels/flash/fwd_traits.cuh"
#include "kernels/flash/ptx.cuh"

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

// All in int32: rows and keys are below kMaxSeqLen and windows at most kUnboundedWindow.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ FwdBlock LocateBlock(const FwdKernelArgs& args, int m_block,
                                                int len_q, int len_k) {
  FwdBlock b;
  b.row_first = m_block * kBlockM;
  b.rows_valid = min(kBlockM, len_q - b.row_first);
  b.len_k = len_k;
  b.diagonal = b.row_first + len_k - len_q;
  const int last_diagonal = b.diagonal + b.rows_valid - 1;  // the bottom row's
  // Keys past the bottom row's right edge and before the top row's left edge are never seen.
  const int key_end = min(len_k, last_diagonal + args.window_right + 1);
  const int key_begin = max(0, b.diagonal - args.window_left);
  b.n_end = key_end <= 0 ? 0 : (key_end + kBlockN - 1) / kBlockN;
  b.n_begin = min(key_begin, len_k) / kBlockN;
  // First key the top row does not see; tiles reaching it or the end of the keys need masking.
  const int top_hidden = b.diagonal + args.window_right + 1;
  b.mask_from = min(top_hidden <= 0 ? 0 : top_hidden / kBlockN, len_k / kBlockN);
  // First key the bottom row sees; tiles starting before it need masking.
  const int bottom_first = last_diagonal - args.window_left;
  b.mask_below = bottom_first <= 0 ? 0 : min((bottom_first + kBlockN - 1) / kBlockN, b.n_end);
  return b;
}

template <class Arch, DType kDType, int kHeadDim>
class FwdBlockRunner {
  using T = FwdTraits<Arch, kDType, kHeadDim>;
  using Element = typename T::Element;

 public:
  __device__ __forceinline__ FwdBlockRunner(const FwdKernelArgs& args, const FwdBlock& block,
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
        float sum = row_sum_[mt][h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        // A row that saw no key has sum 0: out 0, lse +inf (NaN inputs stay NaN).
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        const int row = warp_ * T::kWarpRows + mt * T::kMmaM + group + 8 * h;
#pragma unroll
        for (int nt = 0; nt < T::kOTiles; ++nt) {
          const uint32_t packed =
              ptx::PackPair<Element>(o_[mt][nt][2 * h] * inv, o_[mt][nt][2 * h + 1] * inv);
          ptx::StoreShared32(
              q_smem_ + row * T::kSmemRowBytes + (nt * T::kMmaN + 2 * quad_lane) * 2, packed);
        }
        if (quad_lane == 0 && row < block_.rows_valid) {
          lse[row] = sum == 0.0f ? INFINITY : row_max_[mt][h] * args_.lse_scale + logf(sum);
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
    if constexpr (kMask) ApplyMask(s, n);

    // V(n) has landed, and every warp is done with K(n): prefetch K(n-1).
    ptx::WaitAsyncGroups<Arch, 0>();
    __syncthreads();
    if (n > block_.n_begin) {
      LoadKeyTile(k_smem_, args_.k, n - 1);
      ptx::CommitAsyncGroup<Arch>();
    }

    UpdateSoftmax(s);
    AccumulatePV(s);
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

  // Hides the keys each row must not see (past the end, outside the window) with -inf. Bounds
  // are taken relative to this thread's first column so the compares are against immediates.
  __device__ __forceinline__ void ApplyMask(float (&s)[T::kMTiles][T::kSTiles][4], int n) {
    const int tid = ptx::FreshThreadIdx();
    const int warp = tid / 32;
    const int group = tid % 32 / 4;
    const int first_col = n * T::kBlockN + 2 * (tid % 4);
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int aligned = block_.diagonal + warp * T::kWarpRows + mt * T::kMmaM + group + 8 * h;
        const int last = min(aligned + args_.window_right, block_.len_k - 1) - first_col;
        const int first = aligned - args_.window_left - first_col;
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = nt * T::kMmaN + e;
            if (col > last || col < first) s[mt][nt][2 * h + e] = -INFINITY;
          }
        }
      }
    }
  }

  // Online softmax: new row maxima over the quad, rescale O and the running sums, and turn S
  // into unnormalized probabilities exp2((s - max) * exp2_scale) in place. O is rescaled only
  // when some row of the warp has a new maximum (exact: otherwise every factor is 1), which
  // after the first few tiles is rare.
  __device__ __forceinline__ void UpdateSoftmax(float (&s)[T::kMTiles][T::kSTiles][4]) {
    const float scale = args_.exp2_scale;
    float shift[T::kMTiles][2];
    float correction[T::kMTiles][2];
    bool any_new_max = false;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = row_max_[mt][h];
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt) {
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        any_new_max |= mx != row_max_[mt][h];
        // A row with nothing visible so far keeps max -inf; subtract 0 instead so that
        // exp2(-inf - (-inf)) never turns into NaN.
        shift[mt][h] = mx == -INFINITY ? 0.0f : mx * scale;
        correction[mt][h] = ptx::Exp2(row_max_[mt][h] * scale - shift[mt][h]);
        row_max_[mt][h] = mx;
      }
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
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = ptx::Exp2(fmaf(s[mt][nt][2 * h + e], scale, -shift[mt][h]));
            s[mt][nt][2 * h + e] = p;
            sum += p;
          }
        }
        row_sum_[mt][h] = row_sum_[mt][h] * correction[mt][h] + sum;
      }
    }
  }

  // O += P V: the accumulator layout of two 8-key S tiles is the A layout of one 16-key step.
  __device__ __forceinline__ void AccumulatePV(const float (&p)[T::kMTiles][T::kSTiles][4]) {
#pragma unroll
    for (int kk = 0; kk < T::kPvSteps; ++kk) {
      uint32_t a[T::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) {
        a[mt][0] = ptx::PackPair<Element>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
        a[mt][1] = ptx::PackPair<Element>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
        a[mt][2] = ptx::PackPair<Element>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
        a[mt][3] = ptx::PackPair<Element>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
      }
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

  const FwdKernelArgs& args_;
  const FwdBlock& block_;
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
template <class Arch, DType kDType, int kHeadDim>
__device__ __forceinline__ void FlashForwardCta(const FwdKernelArgs& args) {
  using T = FwdTraits<Arch, kDType, kHeadDim>;
  using Element = typename T::Element;
  extern __shared__ __align__(16) unsigned char smem[];

  // Highest query blocks first: under causal masking they carry the most key tiles.
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

  const int64_t kv_offset = int64_t{k_begin} * args.kv_row_stride + kv_head_offset;
  FwdBlockRunner<Arch, kDType, kHeadDim> runner(args, block, kv_offset, smem);
  runner.Prologue(q);
  runner.Run();
  runner.Epilogue(out, lse);
}

template <class Arch, DType kDType, int kHeadDim>
__global__ void __launch_bounds__(FwdTraits<Arch, kDType, kHeadDim>::kThreads)
    FlashForwardKernel(const __grid_constant__ FwdKernelArgs args) {
  if constexpr (kArchBodyCompiled<Arch>) {
    FlashForwardCta<Arch, kDType, kHeadDim>(args);
  } else {
    __trap();  // an sm80 kernel in an sm_75 binary: never launched there
  }
}

}  // namespace attnserve::kernels::flash
