// No scaling: inv_freq_i = base^(-2i/R) (HF rope_type "default").
#pragma once

#include "common.hpp"

namespace embrope::internal {

struct NoScaling {
  static constexpr RopeScaling kind = RopeScaling::none;
  static constexpr const char* name = "none";
  static constexpr const char* hf_types = "default";
  static constexpr const char* fields = "";
  static void check(const RopeConfig&) {}
  static std::vector<double> inv_freq(const RopeConfig& c) {
    return default_inv_freq(c.rotary_dim, c.base);
  }
  static double attention_factor(const RopeConfig&) { return 1.0; }
  static void from_hf(const HfRopeParams&, RopeConfig&) {}
};

}  // namespace embrope::internal
