// Dynamic NTK scaling (bloc97 and emozilla, 2023): the base grows with the sequence length
// past the pretrained context. HF: _compute_dynamic_ntk_parameters.
#pragma once

#include <algorithm>
#include <cmath>

#include "common.hpp"

namespace embrope::internal {

struct DynamicScaling {
  static constexpr RopeScaling kind = RopeScaling::dynamic;
  static constexpr const char* name = "dynamic";
  static constexpr const char* hf_types = "dynamic";
  static constexpr const char* fields = "factor original_max_positions sequence_length";
  static void check(const RopeConfig& c) {
    check_factor(c, name);
    check_original_max_positions(c, name);
    if (c.rotary_dim == 2) {
      validate::fail(kRopeCacheOp,
                     "rotary_dim 2 is too small for dynamic scaling (exponent R / (R - 2))");
    }
  }
  // base * (factor * L / original - (factor - 1))^(R / (R - 2)), L = the sequence length, at
  // least original (so a sequence within the pretrained context keeps base).
  static double ntk_base(const RopeConfig& c) {
    const double original = static_cast<double>(c.original_max_positions);
    const std::int64_t requested = c.sequence_length > 0 ? c.sequence_length : c.max_positions;
    const double length = std::max(static_cast<double>(requested), original);
    const double r = static_cast<double>(c.rotary_dim);
    return c.base * std::pow(c.factor * length / original - (c.factor - 1.0), r / (r - 2.0));
  }
  static std::vector<double> inv_freq(const RopeConfig& c) {
    return default_inv_freq(c.rotary_dim, ntk_base(c));
  }
  static double attention_factor(const RopeConfig&) { return 1.0; }
  // HF's pretrained context here is always max_position_embeddings: its formula and its
  // rotary module's reset (original_max_seq_len) ignore an original_max_position_embeddings.
  static void from_hf(const HfRopeParams& hf, RopeConfig& c) {
    c.factor = hf.required("factor");
    c.original_max_positions = hf.max_positions();
  }
};

}  // namespace embrope::internal
