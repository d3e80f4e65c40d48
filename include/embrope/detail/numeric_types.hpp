// float16 and bfloat16 storage types and their conversions to and from float32, written once
// for both backends. Conversions to 16 bits round to nearest even (docs/numerics.md);
// NaN stays NaN and overflow gives infinity. Bit-exact on the CPU and the GPU.
#pragma once

#include <cstdint>
#include <cstring>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};

EMBROPE_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
EMBROPE_HD float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 is the top half of a float32: widen by shifting, narrow by rounding the low half.
EMBROPE_HD float bfloat16_to_float(std::uint16_t h) {
  return bits_float(std::uint32_t{h} << 16);
}
EMBROPE_HD std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  // Selects rather than branches, so that CPU loops vectorize.
  return static_cast<std::uint16_t>((nan ? (u | 0x400000u) : rounded) >> 16);
}

// IEEE binary16 <-> binary32, after F. Giesen's branch-light conversions (public domain,
// "half_to_float" and "float_to_half_fast3_rtne").
EMBROPE_HD float half_to_float(std::uint16_t h) {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13;  // exponent mask after shift
  const std::uint32_t bits = (std::uint32_t{h} & 0x7fffu) << 13;
  const std::uint32_t exp = shifted_exp & bits;
  const std::uint32_t normal = bits + ((127u - 15u) << 23);     // rebias the exponent
  const std::uint32_t special = normal + ((128u - 16u) << 23);  // Inf or NaN: exponent all ones
  // Zero or subnormal: renormalise through a float subtraction.
  const std::uint32_t subnormal =
      float_bits(bits_float(normal + (1u << 23)) - bits_float(113u << 23));
  // Bit masks rather than branches or selects, so that CPU loops vectorize.
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(exp == shifted_exp);
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(exp == 0);
  const std::uint32_t o =
      (special & is_special) | (subnormal & is_subnormal) | (normal & ~(is_special | is_subnormal));
  return bits_float(o | ((std::uint32_t{h} & 0x8000u) << 16));
}

EMBROPE_HD std::uint16_t float_to_half(float value) {
  constexpr std::uint32_t f32_infinity = 255u << 23;
  constexpr std::uint32_t f16_overflow = (127u + 16u) << 23;  // 65536: rounds to infinity
  constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t f = float_bits(value);
  const std::uint32_t sign = f & 0x80000000u;
  f ^= sign;
  // All three results are computed and one is kept by bit masks (no branches or selects:
  // CPU loops vectorize).
  // Inf or NaN (NaN stays a quiet NaN):
  const std::uint32_t special = f > f32_infinity ? 0x7e00u : 0x7c00u;
  // Subnormal or zero: one float addition aligns the mantissa and rounds it to nearest even
  // (the FPU's rounding mode; embrope never builds with flush-to-zero).
  const std::uint32_t subnormal =
      float_bits(bits_float(f) + bits_float(denorm_magic)) - denorm_magic;
  // Normal: rebias the exponent, round to nearest, ties to even.
  const std::uint32_t normal =
      (f + (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(f >= f16_overflow);
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(f < (113u << 23));
  const std::uint32_t o = (special & is_special) | (subnormal & is_subnormal & ~is_special) |
                          (normal & ~(is_special | is_subnormal));
  return static_cast<std::uint16_t>(o | (sign >> 16));
}

// Load and store of a value element as float32.
EMBROPE_HD float to_float(float x) {
  return x;
}
EMBROPE_HD float to_float(Half x) {
  return half_to_float(x.bits);
}
EMBROPE_HD float to_float(BFloat16 x) {
  return bfloat16_to_float(x.bits);
}

template <typename T>
EMBROPE_HD T from_float(float x);
template <>
EMBROPE_HD float from_float<float>(float x) {
  return x;
}
template <>
EMBROPE_HD Half from_float<Half>(float x) {
  return Half{float_to_half(x)};
}
template <>
EMBROPE_HD BFloat16 from_float<BFloat16>(float x) {
  return BFloat16{float_to_bfloat16(x)};
}

}  // namespace embrope::detail
