// What the two Hopper (sm_90a) backward dK/dV kernels share (bwd_sm90_kernel.cuh at head dims
// 64/128, bwd_sm90_wide_kernel.cuh at 192/256): one CTA's key block and the query tiles whose
// rows see it (the sm80 pair kernel's range), K and V resident and Q, dO, lse and D streamed by
// a producer warpgroup through two cp.async stages in wgmma's 128-byte swizzle (zero-filled past
// the sequence) and handed to the consumer warpgroups on full / empty mbarriers
// (sm90_stage_barriers.cuh), the S^T / dP^T and dV / dK products, P^T from S^T (softcap, masks,
// exp2), the dQ reduction into the float32 workspace, and the dK / dV stores.
// T (BwdSm90Traits or BwdSm90WideTraits) gives the geometry; the loads run on the producer's
// threads [0, kLoaderThreads) (LoadSwizzledTileAsync picks whole rows or the flat order). Where
// T::kPersistent (head dim 64; Sm90BackwardRunsPersistent) a CTA runs several key blocks, one
// BwdSm90Block each, with tile numbers running on across them and K/V buffers taken by turns.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/flash/bwd_args.h"
#include "kernels/flash/bwd_cta_order.cuh"
#include "kernels/flash/bwd_mask_geometry.cuh"
#include "kernels/flash/bwd_sm90_dq_tiles.h"
#include "kernels/flash/sm90_swizzled_tile.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_stage_barriers.cuh"

namespace attnserve::kernels::flash {

// A persistent CTA's progress through its key blocks (T::kPersistent): the query tiles it loaded
// or computed so far (the barriers' phases and the stages' and dS^T buffers' parity run on across
// blocks) and the blocks that had any (they take the K/V buffers by turns).
struct BwdSm90Progress {
  int tiles = 0;
  int blocks = 0;
};
// What a persistent CTA's block keeps beside the rest (a base class, empty otherwise, so that the
// one-CTA-per-block kernels' objects are unchanged): its first tile's number, its number among
// the CTA's blocks with tiles (its place in the ring of two K/V buffers), the CTA's shared memory.
struct BwdSm90PersistentPlace {
  int tile_base = 0;
  int kv_use = 0;
  uint32_t kv_base = 0;
};
struct BwdSm90NoPlace {};

template <class T>
class BwdSm90Block
    : protected std::conditional_t<T::kPersistent, BwdSm90PersistentPlace, BwdSm90NoPlace> {
  static_assert(T::kStages == 2, "two stages: tile it+1 loads under tile it");
  static_assert(T::kLoaderThreads == T::kProducerThreads, "the producer warpgroup loads");

 public:
  using Barriers = Sm90StageBarriers<T::kStages, 1>;
  static_assert(Barriers::kBytes == kSm90BackwardBarrierBytes, "host and device agree");

  __device__ __forceinline__ bool Exists() const { return key_first_ < len_k_; }
  // A persistent CTA's progress after this block.
  __device__ __forceinline__ BwdSm90Progress ProgressAfter(BwdSm90Progress p) const {
    return {p.tiles + iters_, p.blocks + (iters_ > 0 ? 1 : 0)};
  }
  // Stage 0's padding, after its lse and D: the stage ring's barriers, then (persistent) the K/V
  // buffers' ring.
  __device__ __forceinline__ static uint32_t StageBarriers(uint32_t smem) {
    return smem + T::kKvBuffers * 2 * T::kKvBytes + 2 * T::kTileBytes + 2 * T::kBlockM * 4;
  }
  // Persistent: the two K/V buffers as a ring of stages, block n (of those with tiles) in buffer
  // n % 2. Only its `empty` side is used (the consumers release a buffer after their epilogue
  // read dK / dV back out of it); K and V land with the block's first tile, published on the
  // stage ring's full barrier. Thread 0 initializes it before RunSm90Roles' barrier.
  using KvBarriers = Sm90StageBarriers<2, 1>;
  static_assert(!T::kPersistent || KvBarriers::kBytes == Sm90BackwardKvBarrierBytes(T::kPersistent),
                "host and device agree");
  __device__ __forceinline__ static KvBarriers KvRing(uint32_t smem) {
    return KvBarriers(StageBarriers(smem) + kSm90BackwardBarrierBytes);
  }
  __device__ __forceinline__ const Barriers& barriers() const { return barriers_; }

  // The producer warpgroup's whole work: K, V and the first query tile in one group, then each
  // tile into its stage once the consumers released the stage's previous tile. Each tile is
  // published as soon as this thread's copies of it landed: its stage's previous tile was
  // released before it was issued, so waiting here never holds back a stage the consumers need.
  // Persistent: a block without query tiles loads nothing (its consumers store zeros straight),
  // and a block's K/V buffer is refilled only once the consumers' epilogue of the block before it
  // there released it; its first tile waits for its stage like any other.
  __device__ __forceinline__ void Produce() {
    if constexpr (T::kPersistent) {
      if (iters_ == 0) return;
      if (this->kv_use >= 2) KvRing(this->kv_base).WaitEmpty(0, this->kv_use);
      if (Tile(0) >= T::kStages) barriers_.WaitEmpty(0, Tile(0));
    }
    Prologue();
    QueryTile tile = FirstTile();
    for (int it = 0; it < iters_; ++it) {
      if (it > 0) {
        if (Tile(it) >= T::kStages) barriers_.WaitEmpty(0, Tile(it));
        LoadStage(tile, StageSmem(it));
        ptx::CommitAsyncGroup<Sm80>();
      }
      ptx::WaitAsyncGroups<Sm80, 0>();
      barriers_.Publish(0, Tile(it));
      Next(tile);
    }
  }

 protected:
  // K, V and the first query tile, one group (then each tile's loads follow).
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
      LoadStage(FirstTile(), StageSmem(0));
    }
    ptx::CommitAsyncGroup<Sm80>();
  }

  using Element = typename T::Element;
  using MmaScores = ptx::Wgmma<Element, T::kBlockM>;  // 64 keys x kBlockM queries
  using MmaGrad = ptx::Wgmma<Element, T::kHeadDim>;   // 64 keys x head dim

  // A query tile of the loop: its query head (of the kv head's group) and first row.
  struct QueryTile {
    int head;
    int row0;
  };

  // Shared memory from `smem`: K, V (kKvBytes each; persistent: two pairs), the two stages, the
  // dS^T tiles (the kernel lays out anything after them). `progress`: a persistent CTA's blocks
  // before this one.
  __device__ __forceinline__ BwdSm90Block(const BwdKernelArgs& args, uint32_t smem, int batch,
                                          int kv_head, int n_block,
                                          BwdSm90Progress progress = {})
      : args_(args),
        f_(args.fwd),
        kv_head_(kv_head),
        barriers_(StageBarriers(smem)) {
    if constexpr (T::kPersistent) {
      this->tile_base = progress.tiles;
      this->kv_use = progress.blocks;
      this->kv_base = smem;
      k_smem_ = smem + (progress.blocks % 2) * 2 * T::kKvBytes;
    } else {
      k_smem_ = smem;
    }
    v_smem_ = k_smem_ + T::kKvBytes;
    stage_smem_ = smem + T::kKvBuffers * 2 * T::kKvBytes;
    ds_smem_ = stage_smem_ + T::kStages * T::kStageBytes;
    batch_ = batch;
    k_begin_ = f_.cu_seqlens_k[batch];
    len_k_ = f_.cu_seqlens_k[batch + 1] - k_begin_;
    key_first_ = n_block * T::kBlockN;
    q_begin_ = f_.cu_seqlens_q[batch];
    len_q_ = f_.cu_seqlens_q[batch + 1] - q_begin_;
    offset_ = len_k_ - len_q_;  // query row i's diagonal key is i + offset
    vecs_valid_ = f_.head_dim / T::kVecElems;
    // The query tiles whose rows see a key of the block (as the sm80 kernels take them).
    const int key_last = min(len_k_, key_first_ + T::kBlockN) - 1;
    const QueryTiles tiles =
        QueryTilesOfKeyBlock<T::kBlockM>(f_, key_first_, key_last, len_q_, offset_);
    m_begin_ = tiles.begin;
    m_count_ = tiles.count;
    iters_ = m_count_ * f_.head_group;
    // A key block that no mask cuts off from any query row starts at its own query tile and
    // wraps around. Without a mask every CTA of a head has the same tiles, and the CTAs that run
    // together (heads first: consecutive key blocks of each head) would add into the same dQ
    // rows at the same time; staggered, each adds into its own. Key block n starts
    // T::kStartTileStride n tiles on; where the stride divides the tile count, one tile more on
    // each further lap, so that the first m_count_ blocks all start on different tiles. Under a
    // mask the ranges start at different tiles already.
    const bool all_rows = m_begin_ == 0 && m_count_ * T::kBlockM >= len_q_;
    int start = 0;
    if (all_rows && m_count_ > 0) {
      constexpr int kStride = T::kStartTileStride;
      const int lead = n_block * kStride;
      const bool next_lap_shifts = kStride > 1 && m_count_ % kStride == 0;
      start = (lead + (next_lap_shifts ? lead / m_count_ : 0)) % m_count_;
    }
    first_row0_ = (m_begin_ + start) * T::kBlockM;
  }

  // The loop's query tiles: every tile of the group's first query head (from first_row0_,
  // wrapping around), then of the next. Stepping through them (no division per iteration), a
  // loop keeps its own.
  __device__ __forceinline__ QueryTile FirstTile() const {
    return {kv_head_ * f_.head_group, first_row0_};
  }
  __device__ __forceinline__ void Next(QueryTile& tile) const {
    tile.row0 += T::kBlockM;
    if (tile.row0 == (m_begin_ + m_count_) * T::kBlockM) tile.row0 = m_begin_ * T::kBlockM;
    if (tile.row0 == first_row0_) ++tile.head;
  }

  // Tile it of this block in the CTA's load order (the barriers' phases, the stages' and dS^T
  // buffers' parity): it, or after the tiles of the blocks a persistent CTA ran before.
  __device__ __forceinline__ int Tile(int it) const {
    if constexpr (T::kPersistent) {
      return this->tile_base + it;
    } else {
      return it;
    }
  }

  __device__ __forceinline__ uint32_t StageSmem(int it) const {
    return stage_smem_ + (Tile(it) % T::kStages) * T::kStageBytes;
  }
  // Q, dO, lse and D of query tile `tile` into stage `st`. Rows past the sequence read 0 (their
  // Q and dO are 0, so they contribute exactly nothing, and their dQ is never stored).
  __device__ __forceinline__ void LoadStage(QueryTile tile, uint32_t st) {
    const int tid = ptx::FreshThreadIdx();
    const int head = tile.head;
    const int row0 = tile.row0;
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
    const uint64_t keys_desc = ptx::MatrixDescriptor128B(keys, 16, 1024);
    const uint64_t queries_desc = ptx::MatrixDescriptor128B(queries, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kScoreSteps; ++kk) {
      const uint64_t a = ScoreStep<T::kBlockN>(keys_desc, kk);
      MmaScores::SS(acc, a, ScoreStep<T::kBlockM>(queries_desc, kk), kk > 0);
    }
    ptx::WgmmaCommit();
  }
  // The same with K (or V) from registers: `keys` holds this warp's A fragment of each k16 step
  // (T::kRsScores), so only Q (dO) is read from shared memory.
  __device__ __forceinline__ void IssueScores(float (&acc)[T::kSTiles][4],
                                              const uint32_t (&keys)[T::kScoreSteps][4],
                                              uint32_t queries) {
    const uint64_t queries_desc = ptx::MatrixDescriptor128B(queries, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kScoreSteps; ++kk) {
      MmaScores::RSKMajor(acc, keys[kk], ScoreStep<T::kBlockM>(queries_desc, kk), kk > 0);
    }
    ptx::WgmmaCommit();
  }
  // K-major step kk of a kRows-row operand: head-dim block kk / 4, 32 bytes per step inside it.
  template <int kRows>
  __device__ __forceinline__ static uint64_t ScoreStep(uint64_t desc, int kk) {
    return ptx::DescriptorPlus(desc, (kk / 4) * kRows * 128 + (kk % 4) * 32);
  }

  // acc += A (P^T or dS^T fragments) x B (dO or Q: the N-major operand, 64 head-dim columns per
  // 128-byte row, query rows 128 bytes apart, head-dim blocks kBlockM * 128 bytes apart), one
  // committed group (the caller fences first).
  __device__ __forceinline__ void IssueGrad(float (&acc)[T::kDTiles][4],
                                            const uint32_t (&a)[T::kGradSteps][4],
                                            uint32_t rows) {
    const uint64_t rows_desc = ptx::MatrixDescriptor128B(rows, T::kBlockM * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kGradSteps; ++kk) {
      MmaGrad::RS(acc, a[kk], ptx::DescriptorPlus(rows_desc, kk * 16 * 128), 1);
    }
    ptx::WgmmaCommit();
  }

  // The lse (vector 0) or D (vector 1) of the query tile in stage st at this thread's
  // accumulator columns: 8 nt + 2 quad_lane + {0, 1} of each 8-query tile nt.
  __device__ __forceinline__ static void LoadStageVector(uint32_t st, int vector, int quad_lane,
                                                         float2 (&v)[T::kSTiles]) {
    const uint32_t at = st + 2 * T::kTileBytes + vector * T::kBlockM * 4 + 2 * quad_lane * 4;
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) v[nt] = ptx::LoadSharedFloat2(at + nt * 32);
  }

  // Softcap, the masks and P^T = exp2(S^T c - lse log2 e) of the query tile from row0 (its lse
  // at this thread's columns, LoadStageVector) for the warp's 16 keys from warp_key_first, rounded into the A fragments of
  // dV += P^T dO (the accumulator layout of two 8-query tiles is one k16 A fragment); s becomes
  // G = P^T in float32 (times 1 - tanh^2 with softcap; -inf masked scores clamp the factor to
  // 0), dS^T's factor. kSoftcap: whether softcap is on, which both kernels test once and pick
  // their loop copy by, so that the common case issues no softcap code at all (predicated off,
  // it cost ~130 issue slots per warp and tile).
  template <bool kSoftcap>
  __device__ __forceinline__ void ScoresToP(float (&s)[T::kSTiles][4],
                                            uint32_t (&p)[T::kGradSteps][4], int row0,
                                            const float2 (&lse)[T::kSTiles], int warp_key_first,
                                            int group, int quad_lane) {
    if constexpr (kSoftcap) {
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = ptx::Tanh(s[nt][e] * f_.softcap_input_scale);
      }
    }
    // Element-wise masking only where the warp's 16 keys x kBlockM queries cross a mask edge or
    // the end of the keys (warp-uniform), with the sm80 kernel's bounds.
    if (warp_key_first + 16 > len_k_ ||
        warp_key_first + 15 > row0 + offset_ + f_.window_right ||
        warp_key_first < row0 + T::kBlockM - 1 + offset_ - f_.window_left) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = warp_key_first + group + 8 * h;
        const int base = row0 + 2 * quad_lane;
        const int lo = key - offset_ - f_.window_right - base;
        const int hi = key < len_k_ ? key - offset_ + f_.window_left - base : -1;
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = nt * 8 + e;
            if (c < lo || c > hi) s[nt][2 * h + e] = -INFINITY;
          }
        }
      }
    }
    const float exp2_scale = f_.exp2_scale;
    const float lse2_scale = args_.lse_log2_scale;
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float pe[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float t = s[nt][2 * h + e];
          pe[e] = ptx::Exp2(fmaf(t, exp2_scale, -(e ? lse[nt].y : lse[nt].x) * lse2_scale));
          s[nt][2 * h + e] = kSoftcap ? pe[e] * (1.0f - fminf(t * t, 1.0f)) : pe[e];
        }
        p[nt / 2][(nt % 2) * 2 + h] = ptx::PackPair<Element>(pe[0], pe[1]);
      }
    }
  }

  // dQ columns col0.. (64 queries x Mma's N) = dS K from the dS^T tile at ds_st, one committed
  // group: both operands MN-major, K's columns col0.. in head-dim block col0 / 64 at byte
  // (col0 % 64) * 2 of its rows (N = 32 starts mid-row at 64 bytes; the swizzle comes from the
  // address bits, as for the 32-byte k steps of the K-major operands).
  template <class Mma, int kTiles>
  __device__ __forceinline__ void IssueDqColumns(float (&dq)[kTiles][4], uint32_t ds_st,
                                                 int col0) const {
    const uint32_t k_cols = k_smem_ + (col0 / 64) * T::kBlockN * 128 + (col0 % 64) * 2;
    const uint64_t ds_desc = ptx::MatrixDescriptor128B(ds_st, T::kBlockN * 128, 1024);
    const uint64_t k_desc = ptx::MatrixDescriptor128B(k_cols, T::kBlockN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < T::kDqSteps; ++kk) {
      // 16 keys per step: 16 rows of 128 bytes in both tiles.
      Mma::SSTrans(dq, ptx::DescriptorPlus(ds_desc, kk * 16 * 128),
                   ptx::DescriptorPlus(k_desc, kk * 16 * 128), kk > 0);
    }
    ptx::WgmmaCommit();
  }

  // The consumers' meeting before a dQ product reads a tile's dS^T: both warpgroups' rows are in
  // shared memory (written by the generic proxy, read by the tensor cores: fence, then the
  // kernel's named barrier kBarrier). It also keeps the warpgroups within a tile of each other,
  // so two dS^T buffers (by tile parity) suffice.
  template <int kBarrier>
  __device__ __forceinline__ static void PublishDs() {
    ptx::FenceProxyAsyncShared();
    ptx::NamedBarrierSync<T::kConsumerThreads>(kBarrier);
  }

  // The consumers' loop over the query tiles (iters_ > 0) where tile it's dQ is issued in tile
  // it+1 behind its S^T / dP^T: step(it, prev, tile, has_prev) runs tile it behind the fence and
  // barrier that publish tile prev's dS^T; has_prev is std::true_type when it issues prev's dQ
  // (the first tile is a separate instantiation without, so that the wgmma groups in flight at
  // every wait are compile-time facts). last_dq(tile) adds the last tile's dQ after the loop.
  template <int kBarrier, class Step, class LastDq>
  __device__ __forceinline__ void RunDeferredDqTiles(Step&& step, LastDq&& last_dq) {
    QueryTile tile = FirstTile();
    barriers_.WaitFull(0, Tile(0));
    step(0, tile, tile, std::false_type{});
    barriers_.Release(0, Tile(0));
    for (int it = 1; it < iters_; ++it) {
      const QueryTile prev = tile;
      Next(tile);
      barriers_.WaitFull(0, Tile(it));
      PublishDs<kBarrier>();
      step(it, prev, tile, std::true_type{});
      barriers_.Release(0, Tile(it));
    }
    PublishDs<kBarrier>();
    last_dq(tile);
  }

  // dQ by tile (bwd_sm90_dq_tiles.h, where T::kDqStageBytes > 0): consumer warp `piece` stages
  // its share of a tile's dQ in accumulator order (StageDqTiles, per product) and lane 0 adds it
  // to the workspace with one bulk reduction (ReduceDqPiece): 8 per tile, where a
  // red.global.add.v2.f32 per element pair from the accumulators made 4096 and ran 1-24% slower
  // at 64 / 128 (bench/RESULTS.md, "Hopper backward at 64/128: dQ by tile").
  // Warp `piece`'s staging: after the dS^T tiles and the exchange tile (T::kDqStageBytes).
  __device__ __forceinline__ uint32_t DqPieceSmem(int piece) const {
    return ds_smem_ + T::kDsBuffers * T::kDsBytes + T::kExchangeBytes + piece * T::kDqPieceBytes;
  }
  // Before staging: the piece's previous reduction, which reads the staging asynchronously, has
  // read it (issued a whole tile ago, so this rarely waits).
  __device__ __forceinline__ void AwaitDqStaging(int lane) const {
    if (lane == 0) ptx::BulkWaitGroupRead<0>();
    __syncwarp();
  }
  // The 8-column tiles of one dQ product (conflict-free 16-byte stores), from tile first_tile
  // of the piece.
  template <int kTiles>
  __device__ __forceinline__ void StageDqTiles(const float (&dq)[kTiles][4], int first_tile,
                                               int piece, int lane) const {
    const uint32_t stage = DqPieceSmem(piece);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      ptx::StoreSharedFloat4(stage + ((first_tile + t) * 32 + lane) * 16, dq[t][0], dq[t][1],
                             dq[t][2], dq[t][3]);
    }
  }
  // The staged piece of query tile `tile` into the workspace. A piece wholly past the sequence
  // adds nothing (its rows are zero) and is skipped.
  __device__ __forceinline__ void ReduceDqPiece(QueryTile tile, int piece, int lane) const {
    // st.shared is the generic proxy; the bulk reduction reads through the async proxy.
    ptx::FenceProxyAsyncShared();
    __syncwarp();
    if (lane == 0 && tile.row0 + (piece % 4) * 16 < len_q_) {
      float* dst = args_.dq_accum +
                   TileDqChunkOffset(q_begin_, batch_, tile.row0, tile.head, f_.num_heads,
                                     T::kHeadDim) +
                   piece * (T::kDqPieceBytes / 4);
      ptx::BulkReduceAddF32(dst, DqPieceSmem(piece), T::kDqPieceBytes);
      ptx::BulkCommitGroup();
    }
  }
  // The CTA's shared memory must outlive the last reduction's reads (its additions complete on
  // their own; the conversion kernel runs after this grid).
  __device__ __forceinline__ void FinishDqPieces() const {
    if (Sm90ConsumerThread<T>() % 32 == 0) ptx::BulkWaitGroupRead<0>();
  }

  // Rounds the 16 key rows of warp `warp` (rows 16 warp + lane / 4 (+ 8), the accumulator
  // layout) of a dK or dV accumulator, times scale, into `buffer` (the block's K or V tile, which
  // no wgmma reads any more), then stores those of them that exist to `out` (args_.dk or
  // args_.dv) with 16-byte stores.
  __device__ __forceinline__ void StoreKeyRows(const float (&acc)[T::kDTiles][4], float scale,
                                               uint32_t buffer, void* out, int warp, int lane) {
    const int group = lane / 4;
    const int quad_lane = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + group + 8 * h;
#pragma unroll
      for (int nt = 0; nt < T::kDTiles; ++nt) {
        ptx::StoreShared32(buffer + SwizzledOffset<T::kBlockN>(row, nt) + quad_lane * 4,
                           ptx::PackPair<Element>(acc[nt][2 * h] * scale,
                                                  acc[nt][2 * h + 1] * scale));
      }
    }
    __syncwarp();
    const int64_t out_offset = (int64_t{k_begin_} + key_first_) * f_.kv_row_stride +
                               int64_t{kv_head_} * f_.head_dim;
    Element* dst = static_cast<Element*>(out) + out_offset;
    const int rows_valid = len_k_ - key_first_;
    constexpr int kPerLane = 16 * T::kRowVecs / 32;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int idx = i * 32 + lane;
      const int row = warp * 16 + idx / T::kRowVecs;
      const int vec = idx % T::kRowVecs;
      if (row < rows_valid && vec < vecs_valid_) {
        *reinterpret_cast<uint4*>(dst + int64_t{row} * f_.kv_row_stride + vec * T::kVecElems) =
            ptx::LoadShared128(buffer + SwizzledOffset<T::kBlockN>(row, vec));
      }
    }
  }

  // Persistent: after the consumers' epilogue read the block's dK and dV back out of its K/V
  // buffer, each consumer thread releases the buffer to the producer.
  __device__ __forceinline__ void ReleaseKvBuffer() const {
    if constexpr (T::kPersistent) KvRing(this->kv_base).Release(0, this->kv_use);
  }

  // Persistent, a block no query tile sees: dK = dV = 0 stored straight from each consumer
  // thread (16-byte stores; no K/V buffer, so the buffers' turns count only blocks with tiles).
  __device__ __forceinline__ void StoreZeroKeyRows() const {
    const int64_t out_offset = (int64_t{k_begin_} + key_first_) * f_.kv_row_stride +
                               int64_t{kv_head_} * f_.head_dim;
    const int rows_valid = min(len_k_ - key_first_, T::kBlockN);
    const int vecs = rows_valid * vecs_valid_;
    for (int i = Sm90ConsumerThread<T>(); i < vecs; i += T::kConsumerThreads) {
      const int64_t at = out_offset + int64_t{i / vecs_valid_} * f_.kv_row_stride +
                         (i % vecs_valid_) * T::kVecElems;
      *reinterpret_cast<uint4*>(static_cast<Element*>(args_.dk) + at) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(static_cast<Element*>(args_.dv) + at) = make_uint4(0, 0, 0, 0);
    }
  }

  const BwdKernelArgs& args_;
  const FwdKernelArgs& f_;
  int kv_head_;
  int batch_;  // the sequence
  int k_begin_, len_k_, key_first_, q_begin_, len_q_, offset_;
  int vecs_valid_;
  int m_begin_, m_count_, iters_;
  int first_row0_;
  uint32_t k_smem_, v_smem_, stage_smem_, ds_smem_;
  Barriers barriers_;

 private:
  template <int kRows>
  __device__ __forceinline__ void LoadRows(uint32_t smem, const Element* src, int row_stride,
                                           int rows_valid, int tid) {
    LoadSwizzledTileAsync<kRows, T::kRowVecs, T::kLoaderThreads>(smem, src, row_stride,
                                                                  rows_valid, vecs_valid_, tid);
  }
};

}  // namespace attnserve::kernels::flash
