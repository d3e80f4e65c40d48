// RopeCache: cos and sin of every (position, frequency) pair, built once (docs/ops.md,
// "RopeCache").
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "embrope/export.hpp"
#include "embrope/tensor.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// What a cos/sin cache is built from (docs/ops.md):
//   inv_freq_i = base^(-2i / rotary_dim), i < rotary_dim / 2, modified by `scaling`;
//   angle = p * inv_freq_i; cos and sin are multiplied by the attention factor.
// Fields a variant does not use must keep their defaults (a set field that the chosen variant
// ignores is an error, so that a mistyped configuration cannot pass silently).
struct RopeConfig {
  std::int64_t rotary_dim = 0;     // R: even, > 0
  double base = 10000.0;           // theta: finite, > 0
  std::int64_t max_positions = 0;  // positions [0, max_positions) are valid, > 0

  RopeScaling scaling = RopeScaling::none;
  // linear, dynamic, yarn, llama3: the context extension factor (> 0). longrope: the ratio of
  // the extended to the original context, used only for the default attention factor.
  double factor = 1.0;
  // dynamic, yarn, llama3, longrope: the context the model was pretrained with (> 0).
  std::int64_t original_max_positions = 0;
  // dynamic and longrope choose their frequencies by the length of the sequence being
  // processed (HF: max(position_ids) + 1). 0 means max_positions. dynamic: the NTK base uses
  // L = max(sequence_length, original_max_positions). longrope: long_factor when
  // sequence_length > original_max_positions, else short_factor. AdaptiveRopeCache below
  // follows a growing sequence the way HF does.
  std::int64_t sequence_length = 0;
  // yarn: the ramp runs between the dimensions where the pretrained context makes beta_fast
  // and beta_slow rotations (beta_fast > beta_slow > 0); truncate rounds them to integers.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // yarn (DeepSeek-V2/V3): when both are non-zero the attention factor is
  // mscale(factor, mscale) / mscale(factor, mscale_all_dim), mscale(s, m) = 0.1 m ln(s) + 1.
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  // llama3: wavelengths above original / low_freq_factor are divided by factor, those below
  // original / high_freq_factor kept, the band between blended (0 < low < high).
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // longrope: R/2 positive factors each; inv_freq_i = base^(-2i/R) / factor_i.
  std::vector<double> short_factor{};
  std::vector<double> long_factor{};
  // yarn, longrope: 0 derives the attention factor (yarn: mscale rule or 0.1 ln(factor) + 1;
  // longrope: sqrt(1 + ln(factor) / ln(original_max_positions))); > 0 overrides it.
  double attention_factor = 0.0;
};

// RopeConfig's fields in one list, for the code that treats each alike (the C API's
// conversions to and from embrope_rope_config_t, whose fields have the same names; the Python
// binding; the check that a variant's unused fields keep their defaults): X(name) for every
// field but `scaling`. EMBROPE_ROPE_CONFIG_VALUES lists the numbers and flags,
// EMBROPE_ROPE_CONFIG_FACTORS the longrope factor lists (pointers and num_factors in C).
// clang-format off
#define EMBROPE_ROPE_CONFIG_VALUES(X) \
  X(rotary_dim)                       \
  X(base)                             \
  X(max_positions)                    \
  X(factor)                           \
  X(original_max_positions)           \
  X(sequence_length)                  \
  X(beta_fast)                        \
  X(beta_slow)                        \
  X(truncate)                         \
  X(mscale)                           \
  X(mscale_all_dim)                   \
  X(low_freq_factor)                  \
  X(high_freq_factor)                 \
  X(attention_factor)
#define EMBROPE_ROPE_CONFIG_FACTORS(X) X(short_factor) X(long_factor)
// clang-format on

// The frequencies and attention factor a configuration gives, in float64 (throws
// Error(invalid_argument) naming the field and the rule for an invalid configuration).
struct RopeFrequencies {
  std::vector<double> inv_freq;  // R/2 values
  double attention_factor = 1.0;
};
EMBROPE_EXPORT RopeFrequencies rope_frequencies(const RopeConfig& config);

// An immutable cos/sin table on one device: safe to share between threads, streams and layers.
//
// Layout (row-major float32, [max_positions, rotary_dim]): row p holds
//   cos(p f_0) ... cos(p f_{R/2-1})  sin(p f_0) ... sin(p f_{R/2-1}),
// each multiplied by the attention factor. Angles and both products are computed in float64
// and rounded once to float32, so every value is the correctly rounded float64 result (up to
// the float64 libm's own error, far below a float32 ulp).
class EMBROPE_EXPORT RopeCache {
 public:
  // Builds the table on `device`. For a CUDA device the build runs on `stream`, and the
  // constructor waits for it, so the cache is ready for any stream when it returns.
  explicit RopeCache(const RopeConfig& config, Device device = Device::cpu(), Stream stream = {});

  // Axial RoPE (docs/ops.md, "Axial RoPE"): one table for 1 to 4 axes, axis a configured by
  // axes[a] as a one-axis cache would be: its rotary_dim is the axis's share of the rotary
  // features (diffusers' axes_dim), base its theta, scaling its own; so axis a's frequency j is
  // base_a^(-2j / rotary_dim_a), j < rotary_dim_a / 2, as diffusers' get_1d_rotary_pos_embed
  // and HF's VisionRotaryEmbedding compute them. The table is [max_positions, R] with R the sum
  // of the axes' dims, its columns the axes' frequencies one after another, in the one-axis
  // layout (cos of every frequency, then sin). Every axis must have the same max_positions
  // (the table's rows: each axis's coordinates lie in [0, max_positions)) and the same
  // attention factor (1 unless a scaling variant derives another); apply_rope takes the axes
  // from the cache. The axes' presets are in the Python package (embrope.RopeCache.flux, ...).
  static RopeCache axial(const std::vector<RopeConfig>& axes, Device device = Device::cpu(),
                         Stream stream = {});
  ~RopeCache();
  RopeCache(RopeCache&& other) noexcept;
  RopeCache& operator=(RopeCache&& other) noexcept;
  RopeCache(const RopeCache&) = delete;
  RopeCache& operator=(const RopeCache&) = delete;

  // For an axial cache: rotary_dim (the sum of the axes') and max_positions of the table,
  // every other field at its default; axes() holds each axis's configuration.
  const RopeConfig& config() const { return config_; }
  // The axes of an axial cache (empty for a one-axis cache), and their rotary dims.
  const std::vector<RopeConfig>& axes() const { return axes_; }
  std::vector<std::int64_t> axes_dim() const;
  std::int64_t rotary_dim() const { return config_.rotary_dim; }
  std::int64_t max_positions() const { return config_.max_positions; }
  Device device() const { return device_; }
  // The factor folded into cos and sin (1 for the default frequencies).
  double attention_factor() const { return attention_factor_; }
  // inv_freq_i in float64, as used for the table (after scaling).
  double inv_freq(std::int64_t i) const;
  const std::vector<double>& inv_freqs() const { return inv_freq_; }

  // The table itself (device memory for a CUDA cache), [max_positions, rotary_dim] float32.
  const float* data() const { return data_; }
  Tensor table() const;

  // One value of a CPU cache; throws for a CUDA cache or an index outside the table.
  float cos(std::int64_t position, std::int64_t i) const;
  float sin(std::int64_t position, std::int64_t i) const;
  // Copies the whole table, from any device, into two host arrays of
  // max_positions * rotary_dim / 2 floats each (row-major [position][i]).
  void copy_to_host(float* cos, float* sin) const;

 private:
  RopeCache() = default;
  void build(const std::vector<double>& inv_freq, double attention_factor, Stream stream);
  void release() noexcept;
  RopeConfig config_{};
  Device device_{};
  double attention_factor_ = 1.0;
  std::vector<double> inv_freq_;
  float* data_ = nullptr;
  std::vector<RopeConfig> axes_;
};

// A cache that follows the length of the sequence being processed, for the variants whose
// frequencies depend on it, with the rules of HF transformers' dynamic_rope_update:
//  - dynamic: starts at sequence length original_max_positions. A longer sequence than the
//    current one rebuilds the table for that length (NTK base for L = length, rows
//    max(max_positions, length)); a sequence shorter than original_max_positions after growth
//    returns to the original frequencies. Each rebuild costs one table build.
//  - longrope: the short table for lengths <= original_max_positions, the long one above
//    (both max_positions rows, each built once, on first use).
//  - every other variant: one table, max_positions rows.
// get() may be called from several threads; the cache it returns stays valid while held.
class EMBROPE_EXPORT AdaptiveRopeCache {
 public:
  explicit AdaptiveRopeCache(const RopeConfig& config, Device device = Device::cpu());
  // The cache for a sequence of `sequence_length` tokens (HF: max(position_ids) + 1).
  // A length above max_positions is an error, except for dynamic scaling, which grows.
  std::shared_ptr<const RopeCache> get(std::int64_t sequence_length, Stream stream = {});
  const RopeConfig& config() const { return config_; }

 private:
  RopeConfig config_;
  Device device_;
  std::mutex mutex_;
  std::int64_t cached_length_ = 0;  // dynamic: the length the current table was built for
  std::shared_ptr<const RopeCache> current_, short_, long_;
};

EMBROPE_END_NAMESPACE
