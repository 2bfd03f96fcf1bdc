// Moving tiles between global and shared memory for the flash kernels: loads of row tiles (rows
// past the sequence and head-dim padding zero-filled) with cp.async on Sm80 or through registers
// on Sm75, and the 16-byte stores of finished output rows.
#pragma once

#include <cstdint>

#include "kernels/flash/ptx.cuh"

namespace attnserve::kernels::flash {

// Copies kRows rows of kRowVecs 16-byte vectors into shared memory at `smem` (rows kRowBytes
// apart): on Sm80 asynchronously (cp.async; lands by the next WaitAsyncGroups), on Sm75 with
// every 16-byte load of the thread issued first into registers and then stored (complete on
// return, the loads in flight together). Row r of the source starts at src + r * row_stride;
// rows at or past `rows_valid` and vectors at or past `vecs_valid` are filled with zeros, never
// read.
// Offsets are 32-bit (the host checks that a tile spans less than 2^31 elements), which keeps
// the per-thread address registers that live across the main loop to one each.
template <class Arch, int kRows, int kRowVecs, int kRowBytes, int kThreads, typename Element>
__device__ __forceinline__ void LoadRowsAsync(uint32_t smem, const Element* src, int row_stride,
                                              int rows_valid, int vecs_valid, int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kPerThread = kRows * kRowVecs / kThreads;
  if constexpr (kThreads % kRowVecs == 0) {
    // Every pass covers whole rows: one row/vector pair per thread, stepped by whole rows, so
    // the shared-memory steps are immediates.
    constexpr int kRowsPerPass = kThreads / kRowVecs;
    const int row0 = tid / kRowVecs;
    const int vec = tid % kRowVecs;
    const int rows_left = rows_valid - row0;
    const bool vec_valid = vec < vecs_valid;
    const uint32_t smem0 = smem + row0 * kRowBytes + vec * 16;
    const Element* from = src + row0 * row_stride + vec * kVecElems;
    const int pass_stride = kRowsPerPass * row_stride;
    if constexpr (Arch::kAsyncCopy) {
#pragma unroll
      for (int it = 0; it < kPerThread; ++it) {
        ptx::CopyAsync16(smem0 + it * kRowsPerPass * kRowBytes, from,
                         vec_valid && it * kRowsPerPass < rows_left);
        from = ptx::Advance(from, pass_stride);
      }
    } else {
      uint4 staged[kPerThread];
#pragma unroll
      for (int it = 0; it < kPerThread; ++it) {
        staged[it] = ptx::LoadGlobal128(from, vec_valid && it * kRowsPerPass < rows_left);
        from = ptx::Advance(from, pass_stride);
      }
#pragma unroll
      for (int it = 0; it < kPerThread; ++it) {
        ptx::StoreShared128(smem0 + it * kRowsPerPass * kRowBytes, staged[it]);
      }
    }
  } else if constexpr (Arch::kAsyncCopy) {
#pragma unroll
    for (int it = 0; it < kPerThread; ++it) {
      const int idx = it * kThreads + tid;
      const int row = idx / kRowVecs;
      const int vec = idx % kRowVecs;
      const bool valid = row < rows_valid && vec < vecs_valid;
      const Element* from = src + (valid ? row * row_stride + vec * kVecElems : 0);
      ptx::CopyAsync16(smem + row * kRowBytes + vec * 16, from, valid);
    }
  } else {
    uint4 staged[kPerThread];
#pragma unroll
    for (int it = 0; it < kPerThread; ++it) {
      const int idx = it * kThreads + tid;
      const int row = idx / kRowVecs;
      const int vec = idx % kRowVecs;
      const bool valid = row < rows_valid && vec < vecs_valid;
      staged[it] =
          ptx::LoadGlobal128(src + (valid ? row * row_stride + vec * kVecElems : 0), valid);
    }
#pragma unroll
    for (int it = 0; it < kPerThread; ++it) {
      const int idx = it * kThreads + tid;
      ptx::StoreShared128(smem + idx / kRowVecs * kRowBytes + idx % kRowVecs * 16, staged[it]);
    }
  }
}

// Copies kRows finished rows from shared memory to global memory with 16-byte stores, skipping
// rows at or past `rows_valid` and vectors at or past `vecs_valid`. kLanes threads take part,
// `lane` being this thread's index among them.
template <int kRows, int kRowVecs, int kRowBytes, int kLanes, typename Element>
__device__ __forceinline__ void StoreRows(Element* dst, int64_t row_stride, uint32_t smem,
                                          int rows_valid, int vecs_valid, int lane) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kPerLane = kRows * kRowVecs / kLanes;
#pragma unroll
  for (int it = 0; it < kPerLane; ++it) {
    const int idx = it * kLanes + lane;
    const int row = idx / kRowVecs;
    const int vec = idx % kRowVecs;
    if (row < rows_valid && vec < vecs_valid) {
      const uint4 value = ptx::LoadShared128(smem + row * kRowBytes + vec * 16);
      *reinterpret_cast<uint4*>(dst + row * row_stride + vec * kVecElems) = value;
    }
  }
}

// Writes zeros to kRows rows of `dst` (the output of rows that see no key at all).
template <int kRows, int kRowVecs, int kThreads, typename Element>
__device__ __forceinline__ void ZeroRows(Element* dst, int64_t row_stride, int rows_valid,
                                         int vecs_valid, int tid) {
  constexpr int kVecElems = 16 / sizeof(Element);
  constexpr int kPerThread = (kRows * kRowVecs + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kPerThread; ++it) {
    const int idx = it * kThreads + tid;
    const int row = idx / kRowVecs;
    const int vec = idx % kRowVecs;
    if (row < rows_valid && vec < vecs_valid) {
      *reinterpret_cast<uint4*>(dst + row * row_stride + vec * kVecElems) = make_uint4(0, 0, 0, 0);
    }
  }
}

}  // namespace attnserve::kernels::flash
