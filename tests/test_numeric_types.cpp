// float16 and bfloat16 conversions (include/embrope/detail/numeric_types.hpp, docs/numerics.md)
// against the independent codecs of tests/reference.hpp: every 16-bit pattern, every tie,
// random floats, overflow, subnormals and NaN.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "embrope/detail/numeric_types.hpp"
#include "reference.hpp"

namespace {

using embrope::detail::bfloat16_to_float;
using embrope::detail::float_to_bfloat16;
using embrope::detail::float_to_half;
using embrope::detail::half_to_float;

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

bool f16_is_nan(std::uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
}
bool bf16_is_nan(std::uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0;
}

std::string hex(std::uint32_t u) {
  std::ostringstream os;
  os << "0x" << std::hex << u;
  return os.str();
}

// Checks the library's float -> 16-bit conversion of x against the reference encoder.
struct NarrowChecker {
  bool bf16;
  ref::Mismatches m;

  void check(float x) {
    const std::uint16_t got = bf16 ? float_to_bfloat16(x) : float_to_half(x);
    if (std::isnan(x)) {
      ++m.checked;
      if (!(bf16 ? bf16_is_nan(got) : f16_is_nan(got))) {
        m.fail("NaN " + hex(to_bits(x)) + " became " + hex(got));
      }
      return;
    }
    const std::uint16_t want = bf16 ? ref::encode_bf16(x) : ref::encode_f16(x);
    m.expect_bits([&] { return "float " + hex(to_bits(x)); }, got, want);
  }
};

}  // namespace

TEST_CASE("float16 to float decodes all 65536 patterns like the bit-field decoder", "[numeric]") {
  ref::Mismatches m;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float got = half_to_float(static_cast<std::uint16_t>(h));
    const double want = ref::decode_f16(static_cast<std::uint16_t>(h));
    ++m.checked;
    if (std::isnan(want)) {
      if (!std::isnan(got)) m.fail("f16 " + hex(h) + " (NaN) decoded to a number");
    } else if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) {
      m.fail("f16 " + hex(h) + " decoded to " + std::to_string(got));
    }
  }
  INFO(m.summary());
  CHECK(m.checked == 65536);
  CHECK(m.count == 0);
  // A few anchors written out by hand.
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0xc000) == -2.0f);
  CHECK(half_to_float(0x7bff) == 65504.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_to_float(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(half_to_float(0x0400) == std::ldexp(1.0f, -14));
  CHECK(std::isinf(half_to_float(0x7c00)));
  CHECK(std::signbit(half_to_float(0x8000)));
}

TEST_CASE("float16 -> float -> float16 round trip is exact for all 65536 patterns", "[numeric]") {
  ref::Mismatches m;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto h16 = static_cast<std::uint16_t>(h);
    const std::uint16_t back = float_to_half(half_to_float(h16));
    ++m.checked;
    if (f16_is_nan(h16)) {
      if (!f16_is_nan(back)) m.fail("NaN f16 " + hex(h) + " came back as " + hex(back));
    } else if (back != h16) {
      m.fail("f16 " + hex(h) + " came back as " + hex(back));
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

TEST_CASE("bfloat16 to float decodes all 65536 patterns like the bit-field decoder", "[numeric]") {
  ref::Mismatches m;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float got = bfloat16_to_float(static_cast<std::uint16_t>(h));
    const double want = ref::decode_bf16(static_cast<std::uint16_t>(h));
    ++m.checked;
    if (std::isnan(want)) {
      if (!std::isnan(got)) m.fail("bf16 " + hex(h) + " (NaN) decoded to a number");
    } else if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) {
      m.fail("bf16 " + hex(h) + " decoded to " + std::to_string(got));
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(bfloat16_to_float(0x3f80) == 1.0f);
  CHECK(bfloat16_to_float(0xc040) == -3.0f);
  CHECK(bfloat16_to_float(0x0001) == std::ldexp(1.0f, -133));
  CHECK(std::isinf(bfloat16_to_float(0xff80)));
}

TEST_CASE("bfloat16 -> float -> bfloat16 round trip is exact for all 65536 patterns", "[numeric]") {
  ref::Mismatches m;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto h16 = static_cast<std::uint16_t>(h);
    const std::uint16_t back = float_to_bfloat16(bfloat16_to_float(h16));
    ++m.checked;
    if (bf16_is_nan(h16)) {
      if (!bf16_is_nan(back)) m.fail("NaN bf16 " + hex(h) + " came back as " + hex(back));
    } else if (back != h16) {
      m.fail("bf16 " + hex(h) + " came back as " + hex(back));
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

TEST_CASE("float to float16 and bfloat16 round to nearest even on random floats", "[numeric]") {
  const bool bf16 = GENERATE(false, true);
  INFO((bf16 ? "bfloat16" : "float16"));
  NarrowChecker checker{bf16, {}};
  std::mt19937_64 rng(ref::seed_of({bf16 ? 2 : 1, 424242}));
  // Any bit pattern: all exponents, NaNs, infinities and float subnormals.
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int n = 0; n < 200000; ++n) checker.check(from_bits(any_bits(rng)));
  // Exponents around the 16-bit format's range, where the rounding matters most.
  const int lo = bf16 ? -140 : -30;
  const int hi = bf16 ? 128 : 17;
  std::uniform_int_distribution<int> exponent(lo, hi);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, (1u << 23) - 1);
  for (int n = 0; n < 200000; ++n) {
    const int e = exponent(rng);
    float x = std::ldexp(1.0f + std::ldexp(static_cast<float>(mantissa(rng)), -23), e);
    if (n % 2 == 1) x = -x;
    checker.check(x);
  }
  INFO(checker.m.summary());
  CHECK(checker.m.checked == 400000);
  CHECK(checker.m.count == 0);
}

TEST_CASE("float to float16 and bfloat16 round every exact tie to even", "[numeric]") {
  const bool bf16 = GENERATE(false, true);
  INFO((bf16 ? "bfloat16" : "float16"));
  NarrowChecker checker{bf16, {}};
  std::int64_t ties_to_even = 0;
  // Every pair of adjacent finite values v0 < v1 of the format (both signs), including the
  // pair (largest finite, "next" = 2^(emax+1)) whose tie overflows to infinity.
  const std::uint32_t inf_bits = bf16 ? 0x7f80 : 0x7c00;
  for (std::uint32_t h = 0; h < inf_bits; ++h) {
    const double v0 = bf16 ? ref::decode_bf16(static_cast<std::uint16_t>(h))
                           : ref::decode_f16(static_cast<std::uint16_t>(h));
    const double v1 = h + 1 == inf_bits
                          ? std::ldexp(1.0, (bf16 ? ref::kBFloat16 : ref::kFloat16).emax + 1)
                          : (bf16 ? ref::decode_bf16(static_cast<std::uint16_t>(h + 1))
                                  : ref::decode_f16(static_cast<std::uint16_t>(h + 1)));
    const double mid = (v0 + v1) / 2;
    const auto tie = static_cast<float>(mid);
    REQUIRE(static_cast<double>(tie) == mid);  // every tie is a float
    for (float sign : {1.0f, -1.0f}) {
      const float x = sign * tie;
      checker.check(x);
      checker.check(std::nextafter(x, 0.0f));
      checker.check(std::nextafter(x, sign * std::numeric_limits<float>::infinity()));
      // The tie itself goes to the neighbour with the even last bit (infinity counts as
      // even: its mantissa is zero).
      const std::uint16_t got = bf16 ? float_to_bfloat16(x) : float_to_half(x);
      const std::uint32_t even = (h % 2 == 0) ? h : h + 1;
      const std::uint32_t want = even | (sign < 0 ? 0x8000u : 0u);
      if (got == want) ++ties_to_even;
    }
  }
  INFO(checker.m.summary());
  CHECK(checker.m.count == 0);
  CHECK(ties_to_even == 2 * static_cast<std::int64_t>(inf_bits));
}

TEST_CASE("float to float16 overflows to infinity and keeps NaN", "[numeric]") {
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(std::nextafter(65520.0f, 0.0f)) == 0x7bff);  // below the tie
  CHECK(float_to_half(65520.0f) == 0x7c00);                        // the tie rounds up to inf
  CHECK(float_to_half(65536.0f) == 0x7c00);
  CHECK(float_to_half(1e30f) == 0x7c00);
  CHECK(float_to_half(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(float_to_half(-65520.0f) == 0xfc00);
  CHECK(float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00);
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0xffc00000u, 0xff800001u,
                            0x7f802000u, 0xffffffffu}) {
    INFO("NaN " << hex(nan));
    CHECK(f16_is_nan(float_to_half(from_bits(nan))));
  }
}

TEST_CASE("float to bfloat16 overflows to infinity and keeps NaN", "[numeric]") {
  CHECK(float_to_bfloat16(from_bits(0x7f7f0000u)) == 0x7f7f);  // largest finite bfloat16
  CHECK(float_to_bfloat16(from_bits(0x7f7f7fffu)) == 0x7f7f);  // below the tie
  CHECK(float_to_bfloat16(from_bits(0x7f7f8000u)) == 0x7f80);  // the tie: to inf (even)
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bfloat16(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(float_to_bfloat16(std::numeric_limits<float>::infinity()) == 0x7f80);
  // NaNs whose payload lies only in the low half must not truncate to infinity.
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0xffffffffu}) {
    INFO("NaN " << hex(nan));
    CHECK(bf16_is_nan(float_to_bfloat16(from_bits(nan))));
  }
}

TEST_CASE("float to float16 handles subnormal results and signed zeros", "[numeric]") {
  const float min_sub = std::ldexp(1.0f, -24);
  CHECK(float_to_half(min_sub) == 0x0001);
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24: even 0
  CHECK(float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(float_to_half(3 * std::ldexp(1.0f, -25)) == 0x0002);  // tie between 1 and 2: even 2
  CHECK(float_to_half(5 * std::ldexp(1.0f, -25)) == 0x0002);  // tie between 2 and 3: even 2
  CHECK(float_to_half(std::ldexp(1023.0f, -24)) == 0x03ff);   // largest subnormal
  CHECK(float_to_half(std::ldexp(1.0f, -14)) == 0x0400);      // smallest normal
  // 1023.5 * 2^-24 is a tie between the largest subnormal and the smallest normal (1024):
  // the even one is 1024.
  CHECK(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);
  CHECK(float_to_half(-std::ldexp(1.0f, -24)) == 0x8001);
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(0.0f) == 0x0000);
  CHECK(float_to_half(-std::ldexp(1.0f, -26)) == 0x8000);  // underflows to -0
  CHECK(float_to_half(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(half_to_float(0x8001) == -min_sub);
}

TEST_CASE("float to bfloat16 handles float subnormals and signed zeros", "[numeric]") {
  CHECK(float_to_bfloat16(std::ldexp(1.0f, -133)) == 0x0001);
  CHECK(float_to_bfloat16(from_bits(0x00008000u)) == 0x0000);  // tie: to even 0
  CHECK(float_to_bfloat16(from_bits(0x00008001u)) == 0x0001);
  CHECK(float_to_bfloat16(from_bits(0x00018000u)) == 0x0002);  // tie: to even 2
  CHECK(float_to_bfloat16(from_bits(0x007fffffu)) == 0x0080);  // rounds up to min normal
  CHECK(float_to_bfloat16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(float_to_bfloat16(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(float_to_bfloat16(-0.0f) == 0x8000);
  CHECK(bfloat16_to_float(0x0001) == std::ldexp(1.0f, -133));
}

TEST_CASE("the reference codecs agree with each other (self-check of the test's oracle)",
          "[numeric][reference]") {
  // encode(decode(h)) == h for all finite patterns, and ulp() matches the spacing.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto h16 = static_cast<std::uint16_t>(h);
    if (!f16_is_nan(h16)) REQUIRE(ref::encode_f16(ref::decode_f16(h16)) == h16);
    if (!bf16_is_nan(h16)) REQUIRE(ref::encode_bf16(ref::decode_bf16(h16)) == h16);
  }
  CHECK(ref::ulp(ref::kFloat16, 1.0) == std::ldexp(1.0, -10));
  CHECK(ref::ulp(ref::kFloat16, 0.0) == std::ldexp(1.0, -24));
  CHECK(ref::ulp(ref::kBFloat16, 1.5) == std::ldexp(1.0, -7));
  CHECK(ref::ulp(ref::kFloat32, -3.0) == std::ldexp(1.0, -22));
  CHECK(ref::encode_f16(1.0 + std::ldexp(1.0, -11)) == 0x3c00);  // tie to even
  CHECK(ref::encode_f16(1.0 + 3 * std::ldexp(1.0, -11)) == 0x3c02);
}
