// LongRoPE (Phi-3; Ding et al. 2024, arXiv:2402.13753): per-frequency factors, the short ones
// within the pretrained context and the long ones past it, and an attention factor from the
// extension ratio. HF: _compute_longrope_parameters (rope_type "longrope", formerly "su").
#pragma once

#include <cmath>

#include "common.hpp"

namespace embrope::internal {

struct LongRopeScaling {
  static constexpr RopeScaling kind = RopeScaling::longrope;
  static constexpr const char* name = "longrope";
  static constexpr const char* hf_types = "longrope su";
  static constexpr const char* fields =
      "factor original_max_positions sequence_length short_factor long_factor attention_factor";

  static void check(const RopeConfig& c) {
    check_factor(c, name);
    check_original_max_positions(c, name);
    const auto check_factors = [&](const char* field, const std::vector<double>& f) {
      if (static_cast<std::int64_t>(f.size()) != c.rotary_dim / 2) {
        validate::fail(kRopeCacheOp, "{} has {} values; longrope needs rotary_dim / 2 = {}", field,
                       f.size(), c.rotary_dim / 2);
      }
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (!finite_positive(f[i])) {
          validate::fail(kRopeCacheOp, "{}[{}] {} must be finite and positive", field, i, f[i]);
        }
      }
    };
    check_factors("short_factor", c.short_factor);
    check_factors("long_factor", c.long_factor);
    if (c.original_max_positions == 1) {
      validate::fail(kRopeCacheOp,
                     "original_max_positions 1 gives no longrope attention factor (ln 1 = 0)");
    }
  }

  // long_factor for a sequence past the pretrained context, else short_factor.
  static bool uses_long(const RopeConfig& c) {
    const std::int64_t length = c.sequence_length > 0 ? c.sequence_length : c.max_positions;
    return length > c.original_max_positions;
  }

  static std::vector<double> inv_freq(const RopeConfig& c) {
    const std::vector<double>& ext = uses_long(c) ? c.long_factor : c.short_factor;
    std::vector<double> f = default_inv_freq(c.rotary_dim, c.base);
    for (std::size_t i = 0; i < f.size(); ++i) f[i] /= ext[i];
    return f;
  }

  static double attention_factor(const RopeConfig& c) {
    if (c.attention_factor > 0.0) return c.attention_factor;
    if (c.factor <= 1.0) return 1.0;
    return std::sqrt(1.0 +
                     std::log(c.factor) / std::log(static_cast<double>(c.original_max_positions)));
  }

  static void from_hf(const HfRopeParams& hf, RopeConfig& c) {
    c.short_factor = hf.numbers("short_factor");
    c.long_factor = hf.numbers("long_factor");
    c.attention_factor = hf.number("attention_factor").value_or(0.0);
    const std::optional<std::int64_t> top = hf.top_level_original_max_positions();
    c.original_max_positions =
        top ? *top : hf.integer("original_max_position_embeddings").value_or(hf.max_positions());
    // Without a factor, the ratio of the extended to the pretrained length.
    c.factor = hf.number("factor").value_or(static_cast<double>(hf.max_positions()) /
                                            static_cast<double>(c.original_max_positions));
  }
};

}  // namespace embrope::internal
