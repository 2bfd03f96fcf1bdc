// The dropout mask contract (kernels/dropout_mask.h): Philox4x32-10 against Random123's
// known-answer vectors (kat_vectors: counter, key, expected), the counter and key layout, and
// the keep threshold.
#include "kernels/dropout_mask.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace attnserve::kernels {
namespace {

void ExpectPhilox(Philox4 counter, uint32_t key0, uint32_t key1, Philox4 want) {
  const Philox4 got = Philox4x32_10(counter, key0, key1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want.v[i]) << "word " << i;
}

TEST(DropoutMask, PhiloxMatchesRandom123KnownAnswers) {
  ExpectPhilox({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  ExpectPhilox({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
               {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  ExpectPhilox({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
               {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
}

TEST(DropoutMask, CounterIsColumnGroupRowHeadSequenceAndKeyIsTheSeed) {
  // The pi vector again, laid out as (seed, sequence, head, row, column).
  const uint64_t seed = (uint64_t{0x299f31d0} << 32) | 0xa4093822;
  const uint32_t column_group = 0x243f6a88;
  for (uint32_t lane = 0; lane < 4; ++lane) {
    const Philox4 bits = DropoutBits(seed, 0x03707344, 0x13198a2e, 0x85a308d3,
                                     column_group * 4 + lane);
    EXPECT_EQ(bits.v[0], 0xd16cfe09u);
    EXPECT_EQ(bits.v[3], 0x24126ea1u);
  }
}

TEST(DropoutMask, ThresholdIsFloorOfPTimesTwoToThe32Clamped) {
  EXPECT_EQ(DropoutThreshold(0.0f), 0u);
  EXPECT_EQ(DropoutThreshold(-1.0f), 0u);
  EXPECT_EQ(DropoutThreshold(0.5f), 0x80000000u);
  EXPECT_EQ(DropoutThreshold(0.25f), 0x40000000u);
  // 0.3f is 0.300000011920928955078125: floor of it times 2^32.
  EXPECT_EQ(DropoutThreshold(0.3f), static_cast<uint32_t>(std::floor(0.3f * 4294967296.0)));
  EXPECT_EQ(DropoutThreshold(1.0f), 0xFFFFFFFFu);
  EXPECT_TRUE(DropoutKeep(0x80000000u, DropoutThreshold(0.5f)));
  EXPECT_FALSE(DropoutKeep(0x7FFFFFFFu, DropoutThreshold(0.5f)));
  EXPECT_TRUE(DropoutKeep(0u, DropoutThreshold(0.0f)));  // p = 0 keeps everything
}

TEST(DropoutMask, KeepRateIsOneMinusP) {
  const uint32_t threshold = DropoutThreshold(0.3f);
  int64_t kept = 0, total = 0;
  for (uint32_t row = 0; row < 512; ++row) {
    for (uint32_t column = 0; column < 512; column += 4) {
      const Philox4 bits = DropoutBits(12345, 1, 2, row, column);
      for (uint32_t word : bits.v) kept += DropoutKeep(word, threshold) ? 1 : 0;
      total += 4;
    }
  }
  const double rate = static_cast<double>(kept) / total;
  const double sigma = std::sqrt(0.7 * 0.3 / total);
  EXPECT_NEAR(rate, 0.7, 5 * sigma);
}

}  // namespace
}  // namespace attnserve::kernels
