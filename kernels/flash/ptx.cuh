// Thin wrappers over the PTX instructions the flash kernels are built from: cp.async (global ->
// shared, 16 bytes, zero-filling), ldmatrix, mma.sync m16n8k16 with fp32 accumulation (two
// m16n8k8 on the Sm75 path), packing fp32 pairs to 16-bit pairs, and the fast exp2 / reciprocal.
// Where the paths differ the wrapper takes the Arch tag (arch.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/flash/arch.h"

namespace attnserve::kernels::flash::ptx {

// Shared-memory address of a generic pointer into shared memory, as the instructions take it.
__device__ __forceinline__ uint32_t SharedAddress(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// threadIdx.x, read afresh where it is used: values derived from it inside the main loop are
// then recomputed there (a few integer ops) instead of being hoisted out of the loop by the
// compiler, where each would hold a register for the whole loop.
__device__ __forceinline__ int FreshThreadIdx() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return tid;
}

// Copies 16 bytes from global to shared memory asynchronously; with `valid` false nothing is
// read (any address will do) and the 16 bytes are filled with zeros (rows past the end,
// head-dim padding).
__device__ __forceinline__ void CopyAsync16(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes));
}

// 16 bytes from global memory (read-only data), or zeros when !valid (nothing is read then).
__device__ __forceinline__ uint4 LoadGlobal128(const void* gmem, bool valid) {
  return valid ? __ldg(static_cast<const uint4*>(gmem)) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ void StoreShared32(uint32_t smem, uint32_t v);

// Copies 4 bytes from global to shared memory, zero-filling when !valid: asynchronously with
// cp.async on Sm80 (lands by the next WaitAsyncGroups), through a register on Sm75.
template <class Arch>
__device__ __forceinline__ void CopyAsync4(uint32_t smem, const void* gmem, bool valid) {
  if constexpr (Arch::kAsyncCopy) {
    const int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(src_bytes));
  } else {
    StoreShared32(smem, valid ? *static_cast<const uint32_t*>(gmem) : 0u);
  }
}

// *addr += a, *(addr + 1) += b in global memory (relaxed, no return value): one vector
// reduction on sm90+, two scalar ones before. addr is 8-byte aligned.
__device__ __forceinline__ void AtomicAddPair(float* addr, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b)
               : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

// addr[0..3] += v (relaxed, no return value): one vector reduction; sm90+ only. addr is 16-byte
// aligned.
__device__ __forceinline__ void AtomicAddQuad(float* addr, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
  atomicAdd(addr + 2, c);
  atomicAdd(addr + 3, d);
#endif
}

// p + elems, computed where it is written: the compiler cannot split it into a loop-invariant
// offset and hoist one 64-bit register pair per tile row out of the main loop.
template <typename Element>
__device__ __forceinline__ const Element* Advance(const Element* p, int elems) {
  const Element* r;
  asm("mad.wide.s32 %0, %1, %2, %3;\n" : "=l"(r) : "r"(elems), "n"(int{sizeof(Element)}), "l"(p));
  return r;
}

// cp.async group bookkeeping; nothing on Sm75, whose copies are complete when issued.
template <class Arch>
__device__ __forceinline__ void CommitAsyncGroup() {
  if constexpr (Arch::kAsyncCopy) asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most `kPending` committed groups of this thread are still in flight.
template <class Arch, int kPending>
__device__ __forceinline__ void WaitAsyncGroups() {
  if constexpr (Arch::kAsyncCopy) asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void LoadMatrixX4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// The same, each matrix transposed on the way (rows of memory become columns of the fragment).
__device__ __forceinline__ void LoadMatrixX4Trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// d += a * b for one 16x8x16 tile with the m16n8k16 instruction (sm80+).
template <typename Element>
__device__ __forceinline__ void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1);

template <>
__device__ __forceinline__ void MmaM16N8K16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void MmaM16N8K16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b for one 16x8x8 fp16 tile (sm75+): a row-major 16x8 in {a0, a1}, b column-major 8x8.
__device__ __forceinline__ void MmaM16N8K8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// d += a * b for one 16x8x16 tile: a row-major 16x16, b column-major 16x8, d fp32 16x8. On Sm75
// as two m16n8k8 over k 0-7 and 8-15: the m16n8k16 fragments split exactly there (A registers
// {a0, a1} hold columns 0-7 of rows g and g + 8, {a2, a3} columns 8-15; B register b0 holds
// k 0-7, b1 k 8-15), so every caller's fragment code is shared by both paths.
template <class Arch, typename Element>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (Arch::kMmaK16) {
    MmaM16N8K16<Element>(d, a, b0, b1);
  } else {
    static_assert(std::is_same_v<Element, __half>, "Turing's mma.sync takes fp16 only");
    MmaM16N8K8(d, a[0], a[1], b0);
    MmaM16N8K8(d, a[2], a[3], b1);
  }
}

// Rounds (lo, hi) to two 16-bit values packed in one register, lo in the low half.
template <typename Element>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // cvt.rn.f16x2.f32 is sm80+; two scalar conversions round the same way.
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
#else
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

// 2^x, relative error 2^-22; 2^-inf = 0.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1/x within one ulp; 1/inf = 0.
__device__ __forceinline__ float Reciprocal(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh through exp2 and a reciprocal: absolute error ~1e-7 (tanh.approx.f32 is ~5e-4), and
// saturates cleanly to +-1.
__device__ __forceinline__ float Tanh(float x) {
  constexpr float kTwoLog2e = 2.8853900817779268f;  // 2 / ln 2
  return 1.0f - 2.0f * Reciprocal(1.0f + Exp2(x * kTwoLog2e));
}

__device__ __forceinline__ void StoreShared128(uint32_t smem, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}

__device__ __forceinline__ uint4 LoadShared128(uint32_t smem) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem));
  return v;
}

__device__ __forceinline__ float2 LoadSharedFloat2(uint32_t smem) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem));
  return v;
}

__device__ __forceinline__ void StoreShared32(uint32_t smem, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem), "r"(v));
}

__device__ __forceinline__ void StoreSharedFloat4(uint32_t smem, float x, float y, float z,
                                                  float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem), "f"(x), "f"(y), "f"(z),
               "f"(w));
}

}  // namespace attnserve::kernels::flash::ptx
