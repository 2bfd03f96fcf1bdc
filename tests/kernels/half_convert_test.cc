// fp16/bf16 conversion: exact round trips, round-to-nearest-even checked against the two
// neighbouring representable values, and the special values.
#include "kernels/reference/half_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace attnserve::kernels::reference {
namespace {

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST(HalfConvert, EveryHalfRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (IsHalfNaN(h)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsHalfNaN(FloatToHalf(f)));
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << std::hex << bits;
    }
  }
}

TEST(HalfConvert, EveryBFloat16RoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float f = BFloat16ToFloat(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
    } else {
      EXPECT_EQ(FloatToBFloat16(f), b) << std::hex << bits;
    }
  }
}

// FloatToX(f) must be the representable value nearest to f, the even one on a tie.
template <typename ToBits, typename ToFloat>
void ExpectNearestEven(float f, ToBits to_bits, ToFloat to_float) {
  const uint16_t h = to_bits(f);
  const double got = to_float(h);
  if (std::isinf(got)) return;  // overflow is checked separately
  const double error = std::abs(got - f);
  // Neighbours one code above and below in magnitude.
  for (int step : {-1, 1}) {
    const uint16_t n = static_cast<uint16_t>(h + step);
    if ((n & 0x7fff) == 0x7fff || ((h & 0x7fff) == 0 && step < 0)) continue;
    const double other = std::abs(static_cast<double>(to_float(n)) - f);
    EXPECT_LE(error, other) << f;
    if (error == other) {
      EXPECT_EQ(h & 1, 0) << "tie not to even: " << f;
    }
  }
}

TEST(HalfConvert, RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> half_exponent(-26, 15), bf16_exponent(-130, 127);
  for (int i = 0; i < 200000; ++i) {
    const float sign = i % 2 ? 1.0f : -1.0f;
    ExpectNearestEven(sign * std::ldexp(mantissa(rng), half_exponent(rng)), FloatToHalf,
                      HalfToFloat);
    ExpectNearestEven(sign * std::ldexp(mantissa(rng), bf16_exponent(rng)), FloatToBFloat16,
                      BFloat16ToFloat);
  }
}

TEST(HalfConvert, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, down to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, up to even
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // halfway to 2^16 rounds to inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);           // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);           // tie to even zero
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);           // smallest normal
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);        // subnormal rounds up to normal
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(std::numeric_limits<float>::signaling_NaN())));
  EXPECT_EQ(HalfToFloat(0x7c00), inf);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));

  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, down to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, up to even
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(FloatToBFloat16(-inf), 0xff80);
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(
      BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::signaling_NaN()))));
}

}  // namespace
}  // namespace attnserve::kernels::reference
