// Scalar IEEE binary16 / bfloat16 <-> float conversion, done with integer bit manipulation so the
// result does not depend on the FPU's rounding mode, FTZ/DAZ flags or -ffast-math.
// float -> 16 bit rounds to nearest, ties to even; NaN stays NaN (made quiet), overflow gives inf.
#pragma once

#include <cstdint>
#include <cstring>

namespace attnserve::kernels::reference {

inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Shifts `value` right by `shift` (1..31) bits, rounding to nearest with ties to even.
inline uint32_t ShiftRightRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  return kept + ((rest > halfway || (rest == halfway && (kept & 1u))) ? 1u : 0u);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  // Rebias the exponent from 15 to 127.
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) {  // NaN: keep the top payload bits, force the quiet bit
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
  }
  if (abs_bits >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16 (or inf): inf
  const int exponent = static_cast<int>(abs_bits >> 23);  // biased by 127
  if (exponent >= 113) {
    // Normal half (>= 2^-14). Rounding may carry into the exponent, up to 0x7c00 = inf, which is
    // exactly what IEEE rounding of values in [65520, 65536) requires.
    const uint32_t rebased = abs_bits - (112u << 23);  // exponent now biased by 15
    return static_cast<uint16_t>(sign | ShiftRightRoundEven(rebased, 13));
  }
  if (exponent < 102) return sign;  // below 2^-25: rounds to (signed) zero
  // Subnormal half: the value in units of 2^-24 is the full significand shifted right.
  const uint32_t significand = (abs_bits & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | ShiftRightRoundEven(significand, 126 - exponent));
}

inline float BFloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Overflow rounds into the inf encoding by itself.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace attnserve::kernels::reference
