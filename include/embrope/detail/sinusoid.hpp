// Sinusoidal absolute positions, Vaswani et al. 2017, "Attention Is All You Need", section
// 3.5: PE(p, 2i) = sin(p / base^(2i/D)), PE(p, 2i+1) = cos(p / base^(2i/D)).
//
// Numerics (docs/numerics.md): a pure function of (p, w) that every backend evaluates with the
// same operations, so that the CPU (portable and vector paths) and the GPU give the same bits.
// The position is split into an anchor and an offset, p = a + b with a a multiple of
// kSinusoidBlock and b < kSinusoidBlock; the sin and cos of the float64 angles a w and b w
// are computed in float64 and rounded to float32, and the angle-addition formulas combine
// them in float32:
//   sin(p w) = sin(a w) cos(b w) + cos(a w) sin(b w)
//   cos(p w) = cos(a w) cos(b w) - sin(a w) sin(b w).
// The split costs two sin/cos where one would do, but it lets the CPU compute the anchor's
// row once per block of consecutive positions and the offsets' rows once per call: a row of
// consecutive positions then costs two float32 multiplies and an add per element instead of
// a sin/cos. Error against float64 sin/cos: at most 1.5e-7 (2.5 x 2^-24).
#pragma once

#include <cmath>
#include <cstdint>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

// Positions share an anchor in blocks of this many.
constexpr std::int64_t kSinusoidBlock = 32;

// Positions at or past this limit are rejected (docs/ops.md): the float64 angle p w would carry
// an error of order 2^-53 p, no longer small against a float32 result, and the reduction
// below is exact only for fewer than 2^32 quarter turns.
constexpr std::int64_t kSinusoidPositionLimit = std::int64_t{1} << 32;

// w_i = base^(-2i / D), i < D / 2, in float64.
EMBROPE_HD double sinusoid_freq(std::int64_t i, std::int64_t dim, double base) {
  return ::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
}

struct SinCos {
  double sin, cos;
};

// sin and cos of an angle in [0, 2^32), in float64 (error within a few float64 ulps of 1).
// Reduction by pi/2 in three parts (Cody and Waite): pi/2 = P1 + P2 + P3, with P1 and P2 of
// 21 significant bits, so that q P1 and q P2 are exact for q < 2^32 and the first subtraction
// is exact (Sterbenz); then the minimax polynomials of fdlibm's __kernel_sin and __kernel_cos
// (Sun Microsystems) on [-pi/4, pi/4], evaluated by Horner's rule with separate multiplies and
// adds, and the quadrant q mod 4 picks and signs them. Arithmetic only (no libm call, no
// branch), so that every backend computes the same bits and CPU loops vectorize.
EMBROPE_HD SinCos sin_cos_f64(double angle) {
  constexpr double two_over_pi = 6.36619772367581382433e-01;
  constexpr double pi_over_2_part1 = 0x1.921fb0p+0;
  constexpr double pi_over_2_part2 = 0x1.5110bp-22;
  constexpr double pi_over_2_part3 = 0x1.18469898cc517p-44;
  const double q = ::rint(angle * two_over_pi);
  const double r = ((angle - q * pi_over_2_part1) - q * pi_over_2_part2) - q * pi_over_2_part3;
  const double z = r * r;
  const double s_poly =
      -1.66666666666666324348e-01 +
      z * (8.33333333332248946124e-03 +
           z * (-1.98412698298579493134e-04 +
                z * (2.75573137070700676789e-06 +
                     z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10))));
  const double c_poly =
      4.16666666666666019037e-02 +
      z * (-1.38888888888741095749e-03 +
           z * (2.48015872894767294178e-05 +
                z * (-2.75573143513906633035e-07 +
                     z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11))));
  const double s = r + (z * r) * s_poly;
  const double c = 1.0 - (0.5 * z - (z * z) * c_poly);
  // The quadrant, q mod 4, exactly in float64 (q = 4k + m < 2^52: (q - 1.5) / 4 lies within
  // 0.375 of k, so rint gives k; rint rather than floor, which compilers do not vectorize).
  const int quadrant = static_cast<int>(q - 4.0 * ::rint((q - 1.5) * 0.25));
  // quadrant 0: (s, c); 1: (c, -s); 2: (-s, -c); 3: (-c, s)
  const double sin_v = (quadrant & 1) ? c : s;
  const double cos_v = (quadrant & 1) ? s : c;
  return {(quadrant & 2) ? -sin_v : sin_v, (quadrant == 1 || quadrant == 2) ? -cos_v : cos_v};
}

// The anchor of a position: the multiple of kSinusoidBlock at or below it (position >= 0).
EMBROPE_HD std::int64_t sinusoid_anchor(std::int64_t position) {
  return position - position % kSinusoidBlock;
}

// sin and cos of p w from those of the anchor's angle a w and the offset's angle b w, each
// rounded once to float32, by the angle-addition formulas in float32 (separate multiplies
// and adds). The cosine adds sin(a w) * -sin(b w), so that both are one form,
// f1 * g1 + f2 * g2, which the CPU evaluates lane by lane from rows of factors in the output's
// layout: for the sine (f1, g1, f2, g2) = (sin a w, cos b w, cos a w, sin b w), for the
// cosine (cos a w, cos b w, sin a w, -sin b w).
EMBROPE_HD float sinusoid_term(float f1, float g1, float f2, float g2) {
  return f1 * g1 + f2 * g2;
}

// The same from the offset's sin and cos already rounded to float32: what a backend that keeps
// the offsets' values of a call in a table (the GPU's workspace) combines.
EMBROPE_HD void sinusoid_combine(SinCos anchor, float sin_b, float cos_b, float* sin_out,
                                 float* cos_out) {
  const auto sin_a = static_cast<float>(anchor.sin), cos_a = static_cast<float>(anchor.cos);
  *sin_out = sinusoid_term(sin_a, cos_b, cos_a, sin_b);
  *cos_out = sinusoid_term(cos_a, cos_b, sin_a, -sin_b);
}

EMBROPE_HD void sinusoid_combine(SinCos anchor, SinCos offset, float* sin_out, float* cos_out) {
  sinusoid_combine(anchor, static_cast<float>(offset.sin), static_cast<float>(offset.cos), sin_out,
                   cos_out);
}

// sin and cos of p w for 0 <= p < kSinusoidPositionLimit: the value every backend gives.
EMBROPE_HD void sinusoid_sin_cos(std::int64_t position, double w, float* sin_out, float* cos_out) {
  const std::int64_t anchor = sinusoid_anchor(position);
  sinusoid_combine(sin_cos_f64(static_cast<double>(anchor) * w),
                   sin_cos_f64(static_cast<double>(position - anchor) * w), sin_out, cos_out);
}

}  // namespace embrope::detail
