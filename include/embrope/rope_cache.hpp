// RopeCache: cos and sin of every (position, frequency) pair, built once (DESIGN.md 3.5).
#pragma once

#include "embrope/detail/export.hpp"

#include <cstdint>

#include "embrope/tensor.hpp"

namespace embrope {

// What a cos/sin cache is built from (DESIGN.md 3.3):
//   inv_freq_i = base^(-2i / rotary_dim), i < rotary_dim / 2,  angle = p * inv_freq_i.
struct RopeConfig {
  std::int64_t rotary_dim = 0;     // R: even, > 0
  double base = 10000.0;           // theta: finite, > 0
  std::int64_t max_positions = 0;  // positions [0, max_positions) are valid, > 0
};

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
  ~RopeCache();
  RopeCache(RopeCache&& other) noexcept;
  RopeCache& operator=(RopeCache&& other) noexcept;
  RopeCache(const RopeCache&) = delete;
  RopeCache& operator=(const RopeCache&) = delete;

  const RopeConfig& config() const { return config_; }
  std::int64_t rotary_dim() const { return config_.rotary_dim; }
  std::int64_t max_positions() const { return config_.max_positions; }
  Device device() const { return device_; }
  // The factor folded into cos and sin (1 for the default frequencies).
  double attention_factor() const { return attention_factor_; }
  // inv_freq_i in float64, as used for the table.
  double inv_freq(std::int64_t i) const;

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
  void release() noexcept;
  RopeConfig config_{};
  Device device_{};
  double attention_factor_ = 1.0;
  float* data_ = nullptr;
};

}  // namespace embrope
