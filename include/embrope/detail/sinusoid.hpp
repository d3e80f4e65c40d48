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

// sin and cos of p * w. The angle is formed and reduced to [-pi, pi] in float64, so only
// the reduced angle is rounded to float32 before the float32 sin and cos (docs/numerics.md): the
// error stays near one float32 ulp of the result at any position.
EMBROPE_HD void sinusoid_sin_cos(std::int64_t position, double w, float* sin_out, float* cos_out) {
  constexpr double two_pi_hi = 6.283185307179586;       // 2 pi rounded to float64
  constexpr double two_pi_lo = 2.4492935982947064e-16;  // 2 pi - two_pi_hi
  constexpr double inv_two_pi = 0.15915494309189535;
  const double angle = static_cast<double>(position) * w;
  const double turns = ::rint(angle * inv_two_pi);
  const double reduced = (angle - turns * two_pi_hi) - turns * two_pi_lo;
  const float r = static_cast<float>(reduced);
  *sin_out = ::sinf(r);
  *cos_out = ::cosf(r);
}

}  // namespace embrope::detail
