// Llama 3.1 scaling (Meta's reference apply_scaling): wavelengths above original /
// low_freq_factor divided by factor, those below original / high_freq_factor kept, the band
// between blended. HF: _compute_llama3_parameters.
#pragma once

#include "common.hpp"

namespace embrope::internal {

struct Llama3Scaling {
  static constexpr RopeScaling kind = RopeScaling::llama3;
  static constexpr const char* name = "llama3";
  static constexpr const char* hf_types = "llama3";
  static constexpr const char* fields =
      "factor original_max_positions low_freq_factor high_freq_factor";

  static void check(const RopeConfig& c) {
    check_factor(c, name);
    check_original_max_positions(c, name);
    if (!finite_positive(c.low_freq_factor) || !std::isfinite(c.high_freq_factor) ||
        c.high_freq_factor <= c.low_freq_factor) {
      validate::fail(kRopeCacheOp,
                     "low_freq_factor {} and high_freq_factor {} must satisfy 0 < low < high",
                     c.low_freq_factor, c.high_freq_factor);
    }
  }

  static std::vector<double> inv_freq(const RopeConfig& c) {
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

  static double attention_factor(const RopeConfig&) { return 1.0; }

  static void from_hf(const HfRopeParams& hf, RopeConfig& c) {
    c.factor = hf.required("factor");
    c.low_freq_factor = hf.required("low_freq_factor");
    c.high_freq_factor = hf.required("high_freq_factor");
    // As a whole number an int64_t holds (integer() refuses others: a larger double's
    // conversion is undefined); required() names it when it is missing.
    // Without one, HF takes max_position_embeddings (standardize_rope_params).
    std::optional<std::int64_t> given = hf.top_level_original_max_positions();
    if (!given) given = hf.integer("original_max_position_embeddings");
    c.original_max_positions = given.value_or(hf.max_positions());
  }
};

}  // namespace embrope::internal
