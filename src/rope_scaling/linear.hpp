// Linear scaling (position interpolation, Chen et al. 2023, arXiv:2306.15595): inv_freq_i /
// factor. HF: _compute_linear_scaling_rope_parameters.
#pragma once

#include "common.hpp"

namespace embrope::internal {

struct LinearScaling {
  static constexpr RopeScaling kind = RopeScaling::linear;
  static constexpr const char* name = "linear";
  static constexpr const char* hf_types = "linear";
  static constexpr const char* fields = "factor";
  static void check(const RopeConfig& c) { check_factor(c, name); }
  static std::vector<double> inv_freq(const RopeConfig& c) {
    std::vector<double> f = default_inv_freq(c.rotary_dim, c.base);
    for (double& v : f) v /= c.factor;
    return f;
  }
  static double attention_factor(const RopeConfig&) { return 1.0; }
  static void from_hf(const HfRopeParams& hf, RopeConfig& c) { c.factor = hf.required("factor"); }
};

}  // namespace embrope::internal
