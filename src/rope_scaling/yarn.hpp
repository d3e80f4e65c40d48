// YaRN (Peng et al. 2023, arXiv:2309.00071): a ramp between the original frequencies
// (extrapolated) and the interpolated ones, and an attention temperature. HF:
// _compute_yarn_parameters (DeepSeek-V2/V3's mscale / mscale_all_dim included).
#pragma once

#include <algorithm>
#include <cmath>

#include "common.hpp"

namespace embrope::internal {

struct YarnScaling {
  static constexpr RopeScaling kind = RopeScaling::yarn;
  static constexpr const char* name = "yarn";
  static constexpr const char* hf_types = "yarn";
  static constexpr const char* fields =
      "factor original_max_positions beta_fast beta_slow truncate mscale mscale_all_dim "
      "attention_factor";

  static void check(const RopeConfig& c) {
    check_factor(c, name);
    check_original_max_positions(c, name);
    if (!finite_positive(c.beta_fast) || !finite_positive(c.beta_slow)) {
      validate::fail(kRopeCacheOp, "beta_fast {} and beta_slow {} must be finite and positive",
                     c.beta_fast, c.beta_slow);
    }
    if (c.beta_fast <= c.beta_slow) {
      validate::fail(kRopeCacheOp, "beta_fast {} must exceed beta_slow {}", c.beta_fast,
                     c.beta_slow);
    }
    if (!std::isfinite(c.mscale) || c.mscale < 0.0 || !std::isfinite(c.mscale_all_dim) ||
        c.mscale_all_dim < 0.0) {
      validate::fail(kRopeCacheOp,
                     "mscale {} and mscale_all_dim {} must be finite and non-negative", c.mscale,
                     c.mscale_all_dim);
    }
    if (c.base == 1.0) {
      validate::fail(kRopeCacheOp, "base 1 gives no yarn correction range (ln base = 0)");
    }
  }

  // The attention temperature: 0.1 m ln(s) + 1 for s > 1, else 1.
  static double mscale(double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  }

  // The (fractional) dimension index at which the pretrained context makes `rotations` turns.
  static double correction_dim(double rotations, const RopeConfig& c) {
    const double r = static_cast<double>(c.rotary_dim);
    return r * std::log(static_cast<double>(c.original_max_positions) / (rotations * 2.0 * kPi)) /
           (2.0 * std::log(c.base));
  }

  static std::vector<double> inv_freq(const RopeConfig& c) {
    double low = correction_dim(c.beta_fast, c);
    double high = correction_dim(c.beta_slow, c);
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

  static double attention_factor(const RopeConfig& c) {
    if (c.attention_factor > 0.0) return c.attention_factor;
    if (c.mscale != 0.0 && c.mscale_all_dim != 0.0) {
      return mscale(c.factor, c.mscale) / mscale(c.factor, c.mscale_all_dim);
    }
    return mscale(c.factor, 1.0);
  }

  static void from_hf(const HfRopeParams& hf, RopeConfig& c) {
    c.factor = hf.required("factor");
    const std::optional<std::int64_t> top = hf.top_level_original_max_positions();
    c.original_max_positions =
        top ? *top : hf.integer("original_max_position_embeddings").value_or(hf.max_positions());
    c.beta_fast = hf.number("beta_fast").value_or(32.0);
    c.beta_slow = hf.number("beta_slow").value_or(1.0);
    c.mscale = hf.number("mscale").value_or(0.0);
    c.mscale_all_dim = hf.number("mscale_all_dim").value_or(0.0);
    c.attention_factor = hf.number("attention_factor").value_or(0.0);
    if (const std::optional<bool> truncate = hf.boolean("truncate")) c.truncate = *truncate;
  }
};

}  // namespace embrope::internal
