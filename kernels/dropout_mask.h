// The dropout mask contract, shared by every kernel family (C++ and CUDA) and mirrored by the
// Python client's NumPy reference (client/python/attnserve/reference.py), so a forward, its
// backward and any family draw exactly the same mask.
//
// Contract (a pure function of the seed and the element's position, nothing else):
// - Generator: Philox4x32-10 (Salmon et al., Random123): multipliers 0xD2511F53 and 0xCD9E8D57,
//   Weyl key increments 0x9E3779B9 and 0xBB67AE85, 10 rounds, key bumped between rounds.
// - Key: the 64-bit dropout seed, key[0] = its low 32 bits, key[1] = its high 32 bits.
// - Counter: {key column / 4, query row, head, sequence}, where the key column and query row
//   count from 0 within their sequence, head is the query head, and sequence is the index of
//   the sequence within the whole request (AttentionOptions::first_sequence plus the index
//   within a launch that covers a sub-range). One call gives 4 uint32s, for key columns
//   4c, 4c+1, 4c+2, 4c+3 in that order.
// - An element is kept iff its uint32 >= threshold, threshold = floor(p * 2^32) clamped to
//   2^32 - 1; kept probabilities are scaled by 1 / (1 - p), dropped ones are 0.
// Only positions a row can see matter; the mask of masked-out keys is never looked at.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTN_DROPOUT_FN __host__ __device__ __forceinline__
#else
#define ATTN_DROPOUT_FN inline
#endif

namespace attnserve::kernels {

struct Philox4 {
  uint32_t v[4];
};

ATTN_DROPOUT_FN uint32_t PhiloxMulHi(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

// Philox4x32-10 of `counter` under `key`: the Random123 known-answer vectors pin it
// (kernels/dropout_mask_test.cc).
ATTN_DROPOUT_FN Philox4 Philox4x32_10(Philox4 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    const uint32_t hi0 = PhiloxMulHi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = PhiloxMulHi(kM1, c2), lo1 = kM1 * c2;
    c0 = hi1 ^ c1 ^ key0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ key1;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

// The 4 uint32s deciding key columns 4 * (column / 4) .. + 3 of one (sequence, head, row).
ATTN_DROPOUT_FN Philox4 DropoutBits(uint64_t seed, uint32_t sequence, uint32_t head,
                                    uint32_t row, uint32_t column) {
  return Philox4x32_10({{column / 4, row, head, sequence}}, static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
}

// floor(p * 2^32) clamped to 2^32 - 1; 0 when p <= 0 (everything kept).
ATTN_DROPOUT_FN uint32_t DropoutThreshold(float p) {
  if (!(p > 0.0f)) return 0;
  const double scaled = static_cast<double>(p) * 4294967296.0;
  return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
}

ATTN_DROPOUT_FN bool DropoutKeep(uint32_t bits, uint32_t threshold) { return bits >= threshold; }

}  // namespace attnserve::kernels

#undef ATTN_DROPOUT_FN
