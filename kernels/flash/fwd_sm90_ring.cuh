// The Hopper (sm_90a) forward's warp specialization and persistent schedule: a producer
// warpgroup streams each query block's Q and its key tiles' K and V into shared-memory slots and
// a ring of stages while the consumer warpgroups (fwd_sm90_kernel.cuh) compute; per stage and
// tensor a `full` mbarrier says the tile has landed and an `empty` one that every consumer is
// done reading it. No CTA barrier is left, within a block or between the blocks a CTA runs, so
// the next block's first tiles load under the current one's last GEMMs and its epilogue
// (FlashAttention-3's structure, with cp.async in place of TMA: zero-fill past a sequence's end
// needs no tensor map per sequence). With T::kBlockNotices the producer alone walks the CTA's
// blocks and tells the consumers where each lies through a notice beside its Q slot.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/flash/fwd_args.h"
#include "kernels/flash/fwd_block.cuh"
#include "kernels/flash/fwd_sm90_traits.cuh"
#include "kernels/flash/ptx.cuh"
#include "kernels/flash/ptx_sm90.cuh"
#include "kernels/flash/sm90_stage_barriers.cuh"
#include "kernels/flash/sm90_swizzled_tile.cuh"

namespace attnserve::kernels::flash {

// What a persistent CTA's consumers need of a block, from the producer's notice
// (T::kBlockNotices): its rows and key tiles, and where its output goes (FwdCta's q_row, head).
struct FwdBlockNotice {
  FwdBlock block;
  int q_row;
  int head;
  int padding[2];  // whole 16-byte words
};

// The shared-memory tiles and their barriers (sm90_stage_barriers.cuh): the Q slots, then the
// K and V stages (kind 0 is K, 1 is V), then the stages' barriers and the Q slots' (and with
// T::kBlockNotices the Q slots' notices). Key tiles are numbered in load order across all the
// blocks a CTA runs (the consumers visit a block's keys last to first), query blocks by the
// order the CTA runs them. A Q slot needs only its
// `empty` barrier: Q lands in the same copy groups as its block's first K tile, whose `full`
// barrier publishes both.
template <class T>
class FwdSm90Ring : public Sm90StageBarriers<T::kStages, 2> {
  using KvBarriers = Sm90StageBarriers<T::kStages, 2>;
  using QBarriers = Sm90StageBarriers<T::kQStages, 1>;
  static constexpr int kKvTiles = T::kQStages * T::kQSmemBytes;

 public:
  static constexpr int kK = 0;
  static constexpr int kV = 1;

  __device__ __forceinline__ explicit FwdSm90Ring(uint32_t tiles)
      : KvBarriers(tiles + T::kTileSmemBytes),
        q_barriers_(tiles + T::kTileSmemBytes + KvBarriers::kBytes),
        tiles_(tiles) {}

  // Thread 0 initializes every barrier; the caller then syncs the CTA (RunSm90Roles). With TMA
  // one producer thread arrives on a full barrier.
  __device__ __forceinline__ void Init(int producer_threads, int consumer_threads) const {
    KvBarriers::Init(T::kTma ? 1 : producer_threads, consumer_threads);
    q_barriers_.Init(producer_threads, consumer_threads);
  }

  // Query block q's slot.
  __device__ __forceinline__ uint32_t Q(int q) const {
    return tiles_ + (q % T::kQStages) * T::kQSmemBytes;
  }
  __device__ __forceinline__ uint32_t K(int i) const {
    return tiles_ + kKvTiles + (i % T::kStages) * T::kKvSmemBytes;
  }
  __device__ __forceinline__ uint32_t V(int i) const {
    return tiles_ + kKvTiles + (T::kStages + i % T::kStages) * T::kKvSmemBytes;
  }
  // Producer: waits until the consumers are done with block q - kQStages's slot.
  __device__ __forceinline__ void WaitQEmpty(int q) const { q_barriers_.WaitEmpty(0, q); }
  // Consumer: nothing this thread issued reads block q's slot any more.
  __device__ __forceinline__ void ReleaseQ(int q) const { q_barriers_.Release(0, q); }

  // With T::kBlockNotices, block q's notice beside its slot: the block's place, written by the
  // producer's thread 0 once the slot is free (the consumers read a notice before they release
  // its slot) and before that thread arrives on the block's first K tile's full barrier, whose
  // release the consumers' wait acquires; or the end of the CTA's blocks.
  __device__ __forceinline__ void WriteNotice(int q,
                                              const FwdCta<typename T::Element>& cta) const {
    WriteNotice(q, FwdBlockNotice{cta.block, cta.q_row, cta.head, {}});
  }
  __device__ __forceinline__ FwdBlockNotice ReadNotice(int q) const {
    uint4 words[kNoticeWords];
#pragma unroll
    for (int w = 0; w < kNoticeWords; ++w) words[w] = ptx::LoadShared128(Notice(q) + 16 * w);
    FwdBlockNotice notice;
    memcpy(&notice, words, sizeof(notice));
    return notice;
  }
  // Producer: the end notice, in the slot and on the K stage the CTA's next block (q, its first
  // key tile i) would have taken, once both are free; the callers then arrive on K(i)'s full
  // barrier as for a tile.
  __device__ __forceinline__ void WriteEndNotice(int q, int i) const {
    if (i >= T::kStages) this->WaitEmpty(kK, i);
    if (q >= T::kQStages) WaitQEmpty(q);
    if (ptx::FreshThreadIdx() == 0) WriteNotice(q, FwdBlockNotice{{}, 0, kEndHead, {}});
  }
  __device__ __forceinline__ static bool IsEndNotice(const FwdBlockNotice& notice) {
    return notice.head == kEndHead;
  }

 private:
  static constexpr int kNoticeWords = kSm90ForwardBlockNoticeBytes / 16;
  static constexpr int kEndHead = -1;
  static_assert(sizeof(FwdBlockNotice) == kSm90ForwardBlockNoticeBytes, "the notice's size");

  __device__ __forceinline__ void WriteNotice(int q, const FwdBlockNotice& notice) const {
    uint4 words[kNoticeWords];
    memcpy(words, &notice, sizeof(notice));
#pragma unroll
    for (int w = 0; w < kNoticeWords; ++w) ptx::StoreShared128(Notice(q) + 16 * w, words[w]);
  }

  __device__ __forceinline__ uint32_t Notice(int q) const {
    return tiles_ + T::kTileSmemBytes + KvBarriers::kBytes + QBarriers::kBytes +
           (q % T::kQStages) * kSm90ForwardBlockNoticeBytes;
  }

  QBarriers q_barriers_;
  uint32_t tiles_;
};

// The query blocks of one persistent CTA: blocks b = blockIdx.x, + gridDim.x, ... of
// m_blocks x heads x sequences, numbered query block fastest, so that the CTAs running at one
// time share K and V in L2, and highest query block first (under causal masking it carries the
// most key tiles), but rotated inside each (head, sequence) by the group's index: with gridDim.x
// a multiple of m_blocks a CTA would otherwise get the same query block of every group, and
// under causal masking the CTAs holding the last blocks would carry all the long rows
// (1.55-1.65x the mean work against 1.03x rotated, 32x512 causal). Calls visit(cta) for each
// block that starts inside its sequence.
template <class T, class Visit>
__device__ __forceinline__ void ForEachForwardBlock(const FwdKernelArgs& args,
                                                    const FwdSm90Grid& grid, Visit&& visit) {
  for (int b = blockIdx.x; b < grid.blocks; b += gridDim.x) {
    const int group = b / grid.m_blocks;  // head + num_heads * sequence
    // (b + group would overflow for b near INT_MAX.)
    const int m_block = grid.m_blocks - 1 - (b - group * grid.m_blocks + group) % grid.m_blocks;
    FwdCta<typename T::Element> cta;
    if (LocateForwardBlock<T::kBlockM, T::kBlockN, T::kBlocksFromEnd>(
            args, m_block, group % args.num_heads, group / args.num_heads, cta)) {
      visit(cta);
    }
  }
}

// Persistent with T::kBlockNotices, a consumer's walk: the CTA's blocks that see keys as the
// producer's notices name them, each read once its first K tile is full; ends at the end notice.
template <class T, class Visit>
__device__ __forceinline__ void ForEachNoticedBlock(const FwdSm90Ring<T>& ring, Visit&& visit) {
  for (int q = 0, first_tile = 0;; ++q) {
    ring.WaitFull(FwdSm90Ring<T>::kK, first_tile);
    const FwdBlockNotice notice = ring.ReadNotice(q);
    if (FwdSm90Ring<T>::IsEndNotice(notice)) return;
    visit(notice);
    first_tile += notice.block.n_end - notice.block.n_begin;
  }
}

// Key tile n of K or V into the stage at `smem` with cp.async from the producer's threads,
// zero-filled past the sequence's keys (lands by their next wait).
template <class T>
__device__ __forceinline__ void LoadKeyTileAsync(uint32_t smem, const void* tensor,
                                                 const FwdKernelArgs& args,
                                                 const FwdCta<typename T::Element>& cta, int n) {
  using Element = typename T::Element;
  const int first_key = n * T::kBlockN;
  const Element* src = static_cast<const Element*>(tensor) + cta.kv_offset +
                       int64_t{first_key} * args.kv_row_stride;
  LoadSwizzledTileAsync<T::kBlockN, T::kRowVecs, T::kProducerThreads>(
      smem, src, static_cast<int>(args.kv_row_stride), cta.block.len_k - first_key,
      args.head_dim / T::kVecElems, ptx::FreshThreadIdx());
}

// Persistent: a block that sees no key gets its answer (out = 0, lse = +inf) from the producer's
// threads, and the consumers skip it; returns whether it was one. (One CTA per block never gets
// such a block: BeginForwardCta wrote it.)
template <class T>
__device__ __forceinline__ bool WroteKeylessBlock(const FwdKernelArgs& args,
                                                  const FwdCta<typename T::Element>& cta) {
  if (!T::kPersistent || !SeesNoKeys(cta.block)) return false;
  WriteKeylessBlock<T::kBlockM, T::kRowVecs, T::kProducerThreads>(args, cta,
                                                                  ptx::FreshThreadIdx());
  return true;
}

// The producer warpgroup: per query block that sees keys, Q (and dO for the backward's dQ
// kernel) with its first K tile, then K and V of every key tile into the ring; the answer of a
// block that sees none. A stage is refilled once the consumers released its previous tile, a Q
// slot once they finished the block before; each tile is published once this thread's copies of
// it landed (Sm90StageBarriers::Publish). One copy group stays in flight while the previous one
// is waited for, across blocks too.
template <class T>
class FwdSm90Producer {
  using Element = typename T::Element;
  using Ring = FwdSm90Ring<T>;

 public:
  // dout: with T::kLoadsDout (the backward's dQ kernel), the tensor laid out like q whose rows
  // go beside Q's in the slot (dO).
  __device__ __forceinline__ FwdSm90Producer(const FwdKernelArgs& args, const Ring& ring,
                                             const void* dout = nullptr)
      : args_(args), ring_(ring), dout_(static_cast<const Element*>(dout)) {}

  // V(i) is published once K(i + 1) is issued, so that one copy group stays in flight; but the
  // dQ kernel's consumers wait for K(i) and V(i) together while still reading K(i - 1) (its dQ
  // product runs behind tile i's scores), and K(i + 1) waits for that stage: a cycle. There
  // (kWholeTiles) a tile's K and V are published together once both landed.
  static constexpr bool kWholeTiles = T::kLoadsDout;

  // The thread index is read afresh wherever it is used (ptx::FreshThreadIdx): held through
  // the loops it would spill under the producer's register cap.
  __device__ __forceinline__ void Block(const FwdCta<Element>& cta) {
    if (WroteKeylessBlock<T>(args_, cta)) return;
    const int tiles = cta.block.n_end - cta.block.n_begin;
    for (int j = 0; j < tiles; ++j) {
      const int i = next_tile_ + j;
      const int n = cta.block.n_end - 1 - j;
      if (i >= T::kStages) ring_.WaitEmpty(Ring::kK, i);
      LoadKeyTileAsync<T>(ring_.K(i), args_.k, args_, cta, n);
      ptx::CommitAsyncGroup<Sm80>();
      if (!kWholeTiles && i > 0) {
        ptx::WaitAsyncGroups<Sm80, 1>();  // V(i - 1) landed, maybe the previous block's
        ring_.Publish(Ring::kV, i - 1);
      }
      if (j == 0) {
        // Only now: the consumers release the slot after the previous block's last V tile.
        if (next_q_ >= T::kQStages) ring_.WaitQEmpty(next_q_);
        if constexpr (T::kBlockNotices) {
          if (ptx::FreshThreadIdx() == 0) ring_.WriteNotice(next_q_, cta);
        }
        LoadSwizzledTileAsync<T::kBlockM, T::kRowVecs, T::kProducerThreads>(
            ring_.Q(next_q_), cta.q, static_cast<int>(args_.q_row_stride), cta.block.rows_valid,
            args_.head_dim / T::kVecElems, ptx::FreshThreadIdx());
        if constexpr (T::kLoadsDout) {
          LoadSwizzledTileAsync<T::kBlockM, T::kRowVecs, T::kProducerThreads>(
              ring_.Q(next_q_) + T::kQTileBytes,
              dout_ + (cta.q - static_cast<const Element*>(args_.q)),
              static_cast<int>(args_.q_row_stride), cta.block.rows_valid,
              args_.head_dim / T::kVecElems, ptx::FreshThreadIdx());
        }
        ptx::CommitAsyncGroup<Sm80>();
      }
      if (i >= T::kStages) ring_.WaitEmpty(Ring::kV, i);
      LoadKeyTileAsync<T>(ring_.V(i), args_.v, args_, cta, n);
      ptx::CommitAsyncGroup<Sm80>();
      if constexpr (kWholeTiles) {
        ptx::WaitAsyncGroups<Sm80, 0>();
        ring_.Publish(Ring::kK, i);
        ring_.Publish(Ring::kV, i);
      } else {
        ptx::WaitAsyncGroups<Sm80, 1>();  // K(i) (and Q with the block's first) landed
        ring_.Publish(Ring::kK, i);
      }
    }
    next_tile_ += tiles;
    ++next_q_;
  }

  // Publishes the last V tile, and the end notice where there are notices.
  __device__ __forceinline__ void Finish() {
    if constexpr (!kWholeTiles) {
      ptx::WaitAsyncGroups<Sm80, 0>();
      if (next_tile_ > 0) ring_.Publish(Ring::kV, next_tile_ - 1);
    }
    if constexpr (T::kBlockNotices) {
      ring_.WriteEndNotice(next_q_, next_tile_);
      ring_.Publish(Ring::kK, next_tile_);
    }
  }

 private:
  const FwdKernelArgs& args_;
  const Ring& ring_;
  const Element* dout_;
  int next_tile_ = 0;  // load-order number of the next key tile
  int next_q_ = 0;     // run-order number of the next block that sees keys
};

}  // namespace attnserve::kernels::flash
