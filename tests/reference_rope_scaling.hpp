// An independent float64 transliteration of HF transformers' RoPE parameter functions
// (src/transformers/modeling_rope_utils.py: _compute_default/linear/dynamic_ntk/yarn/llama3/
// longrope_parameters and dynamic_rope_update), written from that source, not from the
// library's code, with every tensor op done elementwise in float64. `dim` is HF's rotary dim.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ref::hf {

constexpr double kPi = 3.141592653589793238462643383279502884;

// The subset of a HF config the functions read (rope_scaling keys and the top-level fields).
struct RopeParameters {
  std::string rope_type = "default";
  double rope_theta = 10000.0;
  std::int64_t dim = 0;                      // int(head_dim * partial_rotary_factor)
  std::int64_t max_position_embeddings = 0;  // config.max_position_embeddings
  std::optional<double> factor;
  std::optional<std::int64_t> original_max_position_embeddings;  // rope_scaling's
  std::optional<double> attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
  std::optional<bool> truncate;
  std::optional<double> low_freq_factor, high_freq_factor;
  std::vector<double> short_factor, long_factor;
};

struct Result {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
};

// 1 / (base ** (arange(0, dim, 2) / dim))
inline std::vector<double> arange_inv_freq(double base, std::int64_t dim) {
  std::vector<double> out;
  for (std::int64_t j = 0; j < dim; j += 2) {
    out.push_back(1.0 / std::pow(base, static_cast<double>(j) / static_cast<double>(dim)));
  }
  return out;
}

inline Result compute_default(const RopeParameters& c) {
  return {arange_inv_freq(c.rope_theta, c.dim), 1.0};
}

inline Result compute_linear(const RopeParameters& c) {
  Result r = compute_default(c);
  for (double& f : r.inv_freq) f /= *c.factor;
  return r;
}

// seq_len: the current sequence length (dynamic_rope_update passes max(position_ids) + 1).
inline Result compute_dynamic(const RopeParameters& c, std::optional<std::int64_t> seq_len) {
  const double max_pos =
      static_cast<double>(c.original_max_position_embeddings ? *c.original_max_position_embeddings
                                                             : c.max_position_embeddings);
  const double factor = *c.factor;
  double s = max_pos;
  if (seq_len && static_cast<double>(*seq_len) > max_pos) s = static_cast<double>(*seq_len);
  const double d = static_cast<double>(c.dim);
  const double base =
      c.rope_theta * std::pow((factor * s / max_pos) - (factor - 1.0), d / (d - 2.0));
  return {arange_inv_freq(base, c.dim), 1.0};
}

inline double get_mscale(double scale, double mscale = 1.0) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

inline Result compute_yarn(const RopeParameters& c) {
  const double base = c.rope_theta;
  const std::int64_t dim = c.dim;
  const double factor = *c.factor;
  const double original =
      static_cast<double>(c.original_max_position_embeddings ? *c.original_max_position_embeddings
                                                             : c.max_position_embeddings);
  double attention_factor;
  if (c.attention_factor) {
    attention_factor = *c.attention_factor;
  } else if (c.mscale.value_or(0.0) != 0.0 && c.mscale_all_dim.value_or(0.0) != 0.0) {
    attention_factor = get_mscale(factor, *c.mscale) / get_mscale(factor, *c.mscale_all_dim);
  } else {
    attention_factor = get_mscale(factor);
  }
  const double beta_fast = c.beta_fast.value_or(32.0);
  const double beta_slow = c.beta_slow.value_or(1.0);
  const auto find_correction_dim = [&](double num_rotations) {
    return (static_cast<double>(dim) * std::log(original / (num_rotations * 2.0 * kPi))) /
           (2.0 * std::log(base));
  };
  double low = find_correction_dim(beta_fast);
  double high = find_correction_dim(beta_slow);
  if (c.truncate.value_or(true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;

  Result r;
  r.attention_factor = attention_factor;
  for (std::int64_t j = 0; j < dim / 2; ++j) {
    const double pos_freq = std::pow(base, static_cast<double>(2 * j) / static_cast<double>(dim));
    const double extrapolation = 1.0 / pos_freq;
    const double interpolation = 1.0 / (factor * pos_freq);
    const double linear = (static_cast<double>(j) - low) / (high - low);
    const double ramp = std::min(std::max(linear, 0.0), 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    r.inv_freq.push_back(interpolation * (1.0 - extrapolation_factor) +
                         extrapolation * extrapolation_factor);
  }
  return r;
}

inline Result compute_llama3(const RopeParameters& c) {
  Result r = compute_default(c);
  const double factor = *c.factor;
  const double low_freq_factor = *c.low_freq_factor;
  const double high_freq_factor = *c.high_freq_factor;
  const double old_context_len = static_cast<double>(*c.original_max_position_embeddings);
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  for (double& inv_freq : r.inv_freq) {
    const double wavelen = 2.0 * kPi / inv_freq;
    double llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
    const double smooth =
        (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
    const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    inv_freq = is_medium ? smoothed : llama;
  }
  return r;
}

// original: the model's pretrained context (Phi-3: config.original_max_position_embeddings).
// seq_len: the current sequence length (longrope_frequency_update: max(position_ids) + 1).
inline Result compute_longrope(const RopeParameters& c, std::int64_t original,
                               std::int64_t seq_len) {
  double factor = c.factor.value_or(1.0);
  double attention_factor;
  if (c.attention_factor) {
    attention_factor = *c.attention_factor;
  } else if (factor <= 1.0) {
    attention_factor = 1.0;
  } else {
    attention_factor = std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(original)));
  }
  const std::vector<double>& ext = seq_len > original ? c.long_factor : c.short_factor;
  Result r;
  r.attention_factor = attention_factor;
  for (std::int64_t j = 0; j < c.dim / 2; ++j) {
    const double shape = static_cast<double>(2 * j) / static_cast<double>(c.dim);
    r.inv_freq.push_back(1.0 / (ext[static_cast<std::size_t>(j)] * std::pow(c.rope_theta, shape)));
  }
  return r;
}

}  // namespace ref::hf
