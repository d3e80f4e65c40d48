// float16 and bfloat16 storage types and their conversions to and from float32, written once
// for both backends. Conversions to 16 bits round to nearest even (docs/numerics.md);
// NaN stays NaN and overflow gives infinity. Bit-exact on the CPU and the GPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "embrope/detail/config.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace embrope::detail {

struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};
// OCP 8-bit floats (OCP 8-bit Floating Point Specification (OFP8), rev. 1.0, 2023), the KV
// cache formats of PyTorch (float8_e4m3fn, float8_e5m2) and CUDA (__nv_fp8_e4m3, _e5m2).
// Each with its format's parameters for float_to_float8 (below): mantissa bits, exponent
// bias, the largest finite code and the NaN code (S.1111.111 in both formats, the code
// PyTorch's float8 conversions store).
struct Float8E4M3 {  // 1-4-3, bias 7, no infinity, NaN = S.1111.111, largest finite 448
  std::uint8_t bits;
  static constexpr int mantissa_bits = 3, bias = 7;
  static constexpr std::uint32_t max_code = 0x7eu, nan_code = 0x7fu;
};
struct Float8E5M2 {  // 1-5-2, bias 15, IEEE-like (infinity, NaN), largest finite 57344
  std::uint8_t bits;
  static constexpr int mantissa_bits = 2, bias = 15;
  static constexpr std::uint32_t max_code = 0x7bu, nan_code = 0x7fu;
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
// Narrowing on the GPU: the conversion instruction (cvt.rn.bf16.f32, cvt.rn.f16.f32 below), one
// where the bit routines take six to twenty integer operations. The same bits for every input
// but NaN, whose sign and payload it drops: NaN is the bit routine's, selected. (Widening
// by the instruction too was also measured, on an H100: float16 ops gained more, but qk-norm +
// RoPE lost 11% to the kernels' new register allocation; widening stays the bit routine.)
EMBROPE_HD std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t u = float_bits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
#if defined(__CUDA_ARCH__)
  const __nv_bfloat16 b = __float2bfloat16(f);  // round to nearest even
  std::uint16_t bits;
  std::memcpy(&bits, &b, sizeof bits);
  return nan ? static_cast<std::uint16_t>((u | 0x400000u) >> 16) : bits;
#else
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
  // Selects rather than branches, so that CPU loops vectorize.
  return static_cast<std::uint16_t>((nan ? (u | 0x400000u) : rounded) >> 16);
#endif
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
#if defined(__CUDA_ARCH__)  // the conversion instruction, as float_to_bfloat16's
  const std::uint32_t u = float_bits(value);
  const __half h = __float2half(value);  // round to nearest even
  std::uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return (u & 0x7fffffffu) > 0x7f800000u
             ? static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u)
             : bits;
#else
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
#endif
}

// float32 -> 8-bit float with `mantissa_bits` and exponent `bias`, round to nearest even,
// saturating: a magnitude past the largest finite code `max_code` (infinity included)
// becomes it, as cuda_fp8.h's __NV_SATFINITE does; NaN becomes `nan_code`, with x's sign.
// Both ranges are computed and one selected, without branches, so that a loop of these
// vectorizes on the CPU.
EMBROPE_HD std::uint8_t float_to_float8(float x, int mantissa_bits, int bias,
                                        std::uint32_t max_code, std::uint32_t nan_code) {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7fffffffu;
  const int drop = 23 - mantissa_bits;  // float32 mantissa bits the format lacks
  // Below the smallest normal: a multiple of the smallest subnormal 2^(1 - bias - M).
  // Scaling by a power of two is exact (so a fused multiply-add gives the same bits), and
  // the quotient, below 2^M, plus 2^23 rounds to an integer, nearest even, held in the low
  // mantissa bits. A result of 2^M is the smallest normal's code, as it should be.
  const float scaled =
      bits_float(a) * bits_float(static_cast<std::uint32_t>(127 + bias - 1 + mantissa_bits) << 23);
  const std::uint32_t subnormal = float_bits(scaled + 8388608.0f) - 0x4b000000u;
  // Normal: rebias the exponent and round the mantissa to nearest even on the bits (a carry
  // moves into the exponent, as it should). Wraps below the normal range, unused there.
  const std::uint32_t rebiased = a - (static_cast<std::uint32_t>(127 - bias) << 23);
  const std::uint32_t normal =
      (rebiased + ((1u << (drop - 1)) - 1u) + ((rebiased >> drop) & 1u)) >> drop;
  // Selections by masks, as float_to_half's, which compilers keep free of branches.
  const std::uint32_t is_subnormal =
      0u - static_cast<std::uint32_t>(a < static_cast<std::uint32_t>(127 - bias + 1) << 23);
  std::uint32_t code = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  const std::uint32_t is_over = 0u - static_cast<std::uint32_t>(code > max_code);
  code = (max_code & is_over) | (code & ~is_over);
  const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>(a > 0x7f800000u);
  return static_cast<std::uint8_t>(sign | (nan_code & is_nan) | (code & ~is_nan));
}
template <typename F8>  // Float8E4M3 or Float8E5M2
EMBROPE_HD std::uint8_t float_to_float8(float x) {
  return float_to_float8(x, F8::mantissa_bits, F8::bias, F8::max_code, F8::nan_code);
}
EMBROPE_HD std::uint8_t float_to_float8_e4m3(float x) {
  return float_to_float8<Float8E4M3>(x);
}
EMBROPE_HD std::uint8_t float_to_float8_e5m2(float x) {
  return float_to_float8<Float8E5M2>(x);
}

// 8-bit float -> float32 (exact): sign, exponent field e, mantissa m.
EMBROPE_HD float float8_to_float(std::uint8_t c, int mantissa_bits, int bias, bool has_infinity) {
  const std::uint32_t sign = std::uint32_t{c & 0x80u} << 24;
  const std::uint32_t m = c & ((1u << mantissa_bits) - 1u);
  const std::uint32_t e = (c & 0x7fu) >> mantissa_bits;
  const std::uint32_t e_max = 0x7fu >> mantissa_bits;
  float magnitude;
  if (e == e_max && (has_infinity || m == (1u << mantissa_bits) - 1u)) {
    magnitude = bits_float(m == 0 && has_infinity ? 0x7f800000u : 0x7fc00000u);
  } else if (e == 0) {  // m * 2^(1 - bias - M), exact
    magnitude = static_cast<float>(m) *
                bits_float(static_cast<std::uint32_t>(127 + 1 - bias - mantissa_bits) << 23);
  } else {
    magnitude = bits_float(((e + 127u - static_cast<std::uint32_t>(bias)) << 23) |
                           (m << (23 - mantissa_bits)));
  }
  return bits_float(float_bits(magnitude) | sign);
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
EMBROPE_HD float to_float(Float8E4M3 x) {
  return float8_to_float(x.bits, Float8E4M3::mantissa_bits, Float8E4M3::bias, false);
}
EMBROPE_HD float to_float(Float8E5M2 x) {
  return float8_to_float(x.bits, Float8E5M2::mantissa_bits, Float8E5M2::bias, true);
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
template <>
EMBROPE_HD Float8E4M3 from_float<Float8E4M3>(float x) {
  return Float8E4M3{float_to_float8_e4m3(x)};
}
template <>
EMBROPE_HD Float8E5M2 from_float<Float8E5M2>(float x) {
  return Float8E5M2{float_to_float8_e5m2(x)};
}

}  // namespace embrope::detail
