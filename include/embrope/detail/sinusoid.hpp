// Sinusoidal absolute positions, Vaswani et al. 2017, "Attention Is All You Need", section
// 3.5: PE(p, 2i) = sin(p / base^(2i/D)), PE(p, 2i+1) = cos(p / base^(2i/D)).
#pragma once

#include <cmath>
#include <cstdint>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

// w_i = base^(-2i / D), i < D / 2, in float64.
EMBROPE_HD double sinusoid_freq(std::int64_t i, std::int64_t dim, double base) {
  return ::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
}

// sin and cos of p * w (docs/numerics.md). The angle is formed and reduced in float64 to
// r in [-pi/4, pi/4] and a quadrant (two-part pi/2), so that only r is rounded to float32;
// then sin(r) and cos(r) are the minimax polynomials of Cephes' sinf and cosf (S. Moshier),
// evaluated in float32 with separate multiplies and adds, and the quadrant picks and signs
// them. The error stays within a couple of float32 ulps at any position. Arithmetic only (no
// libm call, no branch), so that every backend and every CPU vector width computes the same
// bits, and CPU loops over i vectorize.
EMBROPE_HD void sinusoid_sin_cos(std::int64_t position, double w, float* sin_out, float* cos_out) {
  constexpr double two_over_pi = 0.63661977236758134308;
  constexpr double pi_over_2_hi = 1.5707963267948966;      // pi/2 rounded to float64
  constexpr double pi_over_2_lo = 6.123233995736766e-17;   // pi/2 - pi_over_2_hi
  const double angle = static_cast<double>(position) * w;  // >= 0: positions are
  const double quarter_turns = ::rint(angle * two_over_pi);
  const double reduced = (angle - quarter_turns * pi_over_2_hi) - quarter_turns * pi_over_2_lo;
  // The quadrant, quarter_turns mod 4, exactly in float64 (quarter_turns = 4k + m < 2^52:
  // (quarter_turns - 1.5) / 4 lies within 0.375 of k, so rint gives k; rint rather than
  // floor, which compilers do not vectorize).
  const double quadrant_f = quarter_turns - 4.0 * ::rint((quarter_turns - 1.5) * 0.25);
  const int quadrant = static_cast<int>(quadrant_f);
  const float x = static_cast<float>(reduced);
  const float z = x * x;
  const float s = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * x + x;
  const float c =
      ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z -
      0.5f * z + 1.0f;
  // quadrant 0: (s, c); 1: (c, -s); 2: (-s, -c); 3: (-c, s)
  const float sin_v = (quadrant & 1) ? c : s;
  const float cos_v = (quadrant & 1) ? s : c;
  *sin_out = (quadrant & 2) ? -sin_v : sin_v;
  *cos_out = (quadrant == 1 || quadrant == 2) ? -cos_v : cos_v;
}

}  // namespace embrope::detail
