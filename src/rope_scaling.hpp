// The frequencies and attention factor of each RoPE scaling variant, in float64 (host only).
// Semantics: HF transformers, src/transformers/modeling_rope_utils.py (_compute_*_parameters),
// with the rotary dim R in the role of HF's `dim`. Papers: linear, Chen et al. 2023
// (arXiv:2306.15595); dynamic NTK, bloc97 and emozilla (2023); YaRN, Peng et al. 2023
// (arXiv:2309.00071); Llama 3.1, Meta's reference apply_scaling; LongRoPE, Ding et al. 2024
// (arXiv:2402.13753). The configuration is validated by the caller (src/rope_cache.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "embrope/detail/rope_math.hpp"
#include "embrope/rope_cache.hpp"

namespace embrope::internal {

inline constexpr double kPi = 3.14159265358979323846;

// base^(-2i/R) for i < R/2.
inline std::vector<double> default_inv_freq(std::int64_t rotary_dim, double base) {
  std::vector<double> f(static_cast<std::size_t>(rotary_dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = detail::rope_inv_freq(static_cast<std::int64_t>(i), rotary_dim, base);
  }
  return f;
}

// dynamic: base * (factor * L / original - (factor - 1))^(R / (R - 2)), L = the sequence
// length, at least original (so a sequence within the pretrained context keeps base).
inline double dynamic_ntk_base(const RopeConfig& c) {
  const double original = static_cast<double>(c.original_max_positions);
  const std::int64_t requested = c.sequence_length > 0 ? c.sequence_length : c.max_positions;
  const double length = std::max(static_cast<double>(requested), original);
  const double r = static_cast<double>(c.rotary_dim);
  return c.base * std::pow(c.factor * length / original - (c.factor - 1.0), r / (r - 2.0));
}

// YaRN's attention temperature: 0.1 m ln(s) + 1 for s > 1, else 1.
inline double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// The (fractional) dimension index at which the pretrained context makes `rotations` turns.
inline double yarn_correction_dim(double rotations, const RopeConfig& c) {
  const double r = static_cast<double>(c.rotary_dim);
  return r * std::log(static_cast<double>(c.original_max_positions) / (rotations * 2.0 * kPi)) /
         (2.0 * std::log(c.base));
}

inline std::vector<double> yarn_inv_freq(const RopeConfig& c) {
  double low = yarn_correction_dim(c.beta_fast, c);
  double high = yarn_correction_dim(c.beta_slow, c);
  if (c.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(c.rotary_dim - 1));
  if (low == high) high += 0.001;  // as HF: keeps the ramp finite
  std::vector<double> f = default_inv_freq(c.rotary_dim, c.base);
  for (std::size_t i = 0; i < f.size(); ++i) {
    // ramp 0: keep the original frequency (extrapolate); ramp 1: divide by factor.
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / c.factor * ramp + f[i] * (1.0 - ramp);
  }
  return f;
}

inline double yarn_attention_factor(const RopeConfig& c) {
  if (c.attention_factor > 0.0) return c.attention_factor;
  if (c.mscale != 0.0 && c.mscale_all_dim != 0.0) {
    return yarn_mscale(c.factor, c.mscale) / yarn_mscale(c.factor, c.mscale_all_dim);
  }
  return yarn_mscale(c.factor, 1.0);
}

inline std::vector<double> llama3_inv_freq(const RopeConfig& c) {
  const double original = static_cast<double>(c.original_max_positions);
  const double low_freq_wavelen = original / c.low_freq_factor;
  const double high_freq_wavelen = original / c.high_freq_factor;
  std::vector<double> f = default_inv_freq(c.rotary_dim, c.base);
  for (double& v : f) {
    const double wavelen = 2.0 * kPi / v;
    if (wavelen > low_freq_wavelen) {
      v /= c.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (original / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      v = (1.0 - smooth) * v / c.factor + smooth * v;
    }
  }
  return f;
}

inline bool longrope_uses_long(const RopeConfig& c) {
  const std::int64_t length = c.sequence_length > 0 ? c.sequence_length : c.max_positions;
  return length > c.original_max_positions;
}

inline std::vector<double> longrope_inv_freq(const RopeConfig& c) {
  const std::vector<double>& ext = longrope_uses_long(c) ? c.long_factor : c.short_factor;
  std::vector<double> f = default_inv_freq(c.rotary_dim, c.base);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] /= ext[i];
  return f;
}

inline double longrope_attention_factor(const RopeConfig& c) {
  if (c.attention_factor > 0.0) return c.attention_factor;
  if (c.factor <= 1.0) return 1.0;
  return std::sqrt(1.0 +
                   std::log(c.factor) / std::log(static_cast<double>(c.original_max_positions)));
}

}  // namespace embrope::internal
