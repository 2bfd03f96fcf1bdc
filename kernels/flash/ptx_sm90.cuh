// Hopper (sm_90a) instructions of the sm90 kernels beside the wgmma wrappers (ptx_wgmma.cuh):
// warpgroup fences and group bookkeeping, shared-memory matrix descriptors, the proxy fence
// that makes ordinary (cp.async) shared-memory writes visible to the tensor cores' async proxy,
// mbarriers and the register hand-over of warp-specialized kernels.
// Only code compiled for sm_90a may call these (the sm90 instantiations guard their bodies).
#pragma once

#include <cstdint>

#include "kernels/flash/ptx_wgmma.cuh"

namespace attnserve::kernels::flash::ptx {

// Orders this warpgroup's register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes the group of wgmma instructions issued since the last commit.
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Makes the compiler treat `regs` as read and rewritten here, in the order of the volatile asm
// statements: what computes them stays above this point, what reads them below it.
template <int kRows, int kCols>
__device__ __forceinline__ void PinRegisters(float (&regs)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(regs[i][j])::"memory");
  }
}

// Waits until at most kPending committed wgmma groups of this warpgroup are in flight. The
// accumulators of every completed group may be read afterwards; `regs` lists them so the
// compiler cannot move their uses above the wait.
template <int kPending, int kRows, int kCols>
__device__ __forceinline__ void WgmmaWait(float (&regs)[kRows][kCols]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
  PinRegisters(regs);
}

// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async once waited for)
// visible to later async-proxy reads (wgmma operands); a barrier then publishes them.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Adds `bytes` (a multiple of 16) of float32 from shared memory at `smem` to global memory at
// `dst` (both 16-byte aligned), element by element, as one asynchronous bulk operation of this
// thread's current bulk group: the L2 performs the additions, atomically per element.
__device__ __forceinline__ void BulkReduceAddF32(float* dst, uint32_t smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(dst), "r"(smem), "r"(bytes)
               : "memory");
}

// Closes this thread's bulk operations issued since the last commit into one bulk group.
__device__ __forceinline__ void BulkCommitGroup() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups still read their shared memory
// (the source may be written again afterwards; the global writes may still be in flight).
template <int kPending>
__device__ __forceinline__ void BulkWaitGroupRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Barrier `id` (1-15; 0 is __syncthreads') among `kThreads` threads, e.g. one warpgroup.
template <int kThreads>
__device__ __forceinline__ void NamedBarrierSync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Signals barrier `id` among `kThreads` threads without waiting (a producer's half: the
// consumers bar.sync on the same id, producers + consumers = kThreads).
template <int kThreads>
__device__ __forceinline__ void NamedBarrierArrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// mbarrier (8 bytes of shared memory) expecting `count` arrivals per phase. Thread 0 of the CTA
// initializes; FenceMbarrierInit and a CTA barrier then publish it to every thread.
__device__ __forceinline__ void MbarrierInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival (release: this thread's earlier shared-memory accesses happen before the phase
// completes for any thread that waits on it).
__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits (acquire) until the phase of parity `parity` (0 for a fresh barrier's first phase) has
// completed.
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Adds `bytes` to the transaction count the current phase of `bar` waits for: the phase then
// completes only once its arrivals are in and that many bytes of asynchronous copies (TMA) that
// signal it have landed. Issued before the copies it counts.
__device__ __forceinline__ void MbarrierExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

// TMA: copies the box at coordinates (c0, c1, c2) (innermost first, in elements) of the 3-D
// tensor map `map` (a kernel parameter or global memory, 64-byte aligned) into shared memory at
// `smem` in the map's swizzle, and completes that many bytes of `bar`'s transaction count when
// they have landed. Coordinates past the tensor read as zeros.
__device__ __forceinline__ void TmaLoad3d(uint32_t smem, const void* map, int c0, int c1, int c2,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// TMA: copies shared memory at `smem`, laid out in the map's swizzle, into the box at coordinates
// (c0, c1, c2) of the 3-D tensor map `map`, as one operation of this thread's current bulk
// group (BulkCommitGroup, BulkWaitGroupRead). Elements past the tensor are not written.
__device__ __forceinline__ void TmaStore3d(const void* map, int c0, int c1, int c2,
                                           uint32_t smem) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem)
               : "memory");
}

// Warp specialization: a warpgroup gives registers back to the SM (producers) or takes them
// (consumers); every thread of the warpgroup executes it. kRegs: a multiple of 8, 24-256.
template <int kRegs>
__device__ __forceinline__ void ReleaseRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void ClaimRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// This thread's warpgroup (threadIdx.x / 128) as lane 0 of its warp sees it: warp-uniform as
// far as ptxas can tell. Warp-specialized kernels branch on it to split roles; on a branch ptxas
// sees as divergent it serializes every wgmma (C7520).
__device__ __forceinline__ int WarpUniformWarpgroup() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// A CTA's register pool is what it launched with: ptxas' per-thread count for `threads` threads
// (64K / threads, rounded down to 8) times the threads. setmaxnreg.inc waits until the pool has
// what it asks for, so a split that asks for more hangs every launch.
constexpr int RegisterPool(int threads) { return 65536 / threads / 8 * 8 * threads; }
// What each consumer thread can claim once `producer_threads` threads released theirs down to
// `producer_registers`: the rest of the pool, rounded down to 8.
constexpr int ConsumerRegisters(int threads, int producer_threads, int producer_registers) {
  return (RegisterPool(threads) - producer_threads * producer_registers) /
         (threads - producer_threads) / 8 * 8;
}
// Whether such a split fits: setmaxnreg's 256 per thread, and the CTA's pool.
constexpr bool RegisterSplitFits(int threads, int producer_threads, int producer_registers,
                                 int consumer_registers) {
  return consumer_registers <= 256 &&
         producer_registers * producer_threads +
                 consumer_registers * (threads - producer_threads) <=
             RegisterPool(threads);
}

// Shared-memory matrix descriptor of wgmma with the 128-byte swizzle (layout type 1, bits
// 62-63): start address, leading and stride byte offsets, each in 16-byte units (14 bits). The
// swizzle pattern is taken from address bits, so every 8-row x 128-byte atom must start
// 1024-byte aligned (base offset 0).
//   K-major (rows of 64 16-bit elements along K): the stride byte offset steps 8-row groups
//   (1024 bytes); the leading offset is unused (one k16 step stays inside a 128-byte row).
//   MN-major: 64 elements along M/N per 128-byte row, K rows 128 bytes apart; the stride byte
//   offset steps 8-row K groups, the leading byte offset the next 64 elements along M/N.
__device__ __forceinline__ uint64_t MatrixDescriptor128B(uint32_t smem, uint32_t leading_bytes,
                                                         uint32_t stride_bytes) {
  return uint64_t{(smem & 0x3ffffu) >> 4} | (uint64_t{(leading_bytes >> 4) & 0x3fffu} << 16) |
         (uint64_t{(stride_bytes >> 4) & 0x3fffu} << 32) | (uint64_t{1} << 62);
}

// `desc` with its start address moved on by `bytes` (a multiple of 16). The start address field
// holds address bits 4-17 and every tile lies below 256 KB of shared memory, so the add stays
// inside that field: one add on the low word per wgmma, where building each descriptor from its
// address took about eight instructions (the tile loops issue dozens of wgmmas per tile).
__device__ __forceinline__ uint64_t DescriptorPlus(uint64_t desc, uint32_t bytes) {
  const uint32_t low = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | low;
}

}  // namespace attnserve::kernels::flash::ptx
