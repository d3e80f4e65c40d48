// What every RoPE scaling variant's unit (src/rope_scaling/*.hpp) builds on: the default
// frequencies, the checks several variants share, and the view of a HF config's rope
// parameters that a unit reads its fields from. Host only, float64.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "../validate.hpp"
#include "embrope/detail/rope_math.hpp"
#include "embrope/rope_cache.hpp"

namespace embrope::internal {

inline constexpr double kPi = 3.14159265358979323846;
inline constexpr const char* kRopeCacheOp = "RopeCache";

inline bool finite_positive(double v) {
  return std::isfinite(v) && v > 0.0;
}

// base^(-2i/R) for i < R/2.
inline std::vector<double> default_inv_freq(std::int64_t rotary_dim, double base) {
  std::vector<double> f(static_cast<std::size_t>(rotary_dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = detail::rope_inv_freq(static_cast<std::int64_t>(i), rotary_dim, base);
  }
  return f;
}

// The checks of the variants that take a context extension factor and a pretrained context.
inline void check_factor(const RopeConfig& c, const char* scaling) {
  if (!finite_positive(c.factor)) {
    validate::fail(kRopeCacheOp, "factor {} must be finite and positive (scaling {})", c.factor,
                   scaling);
  }
}
inline void check_original_max_positions(const RopeConfig& c, const char* scaling) {
  if (c.original_max_positions <= 0) {
    validate::fail(kRopeCacheOp, "original_max_positions {} must be positive (scaling {})",
                   c.original_max_positions, scaling);
  }
}

// A HF config's rope parameters (rope_scaling, or rope_parameters), as src/model_config.cpp
// reads them: each accessor names the key and where it was when the value is missing or of
// the wrong type.
class HfRopeParams {
 public:
  virtual ~HfRopeParams() = default;
  virtual std::optional<double> number(const char* key) const = 0;
  virtual double required(const char* key) const = 0;
  virtual std::optional<std::int64_t> integer(const char* key) const = 0;
  virtual std::optional<bool> boolean(const char* key) const = 0;
  virtual std::vector<double> numbers(const char* key) const = 0;  // a required list
  // original_max_position_embeddings at the config's top level, which HF
  // (PretrainedConfig.standardize_rope_params) prefers for llama3, yarn and longrope (Phi-3
  // keeps it there).
  virtual std::optional<std::int64_t> top_level_original_max_positions() const = 0;
  virtual std::int64_t max_positions() const = 0;  // the config's max_position_embeddings
};

}  // namespace embrope::internal
