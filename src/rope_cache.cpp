// RopeCache: validation of the configuration, the frequencies, and dispatch of the build.
#include "embrope/rope_cache.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "device_runtime.hpp"
#include "rope_scaling.hpp"
#include "embrope/apply_rope.hpp"
#include "embrope/error.hpp"
#include "embrope/version.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

constexpr const char* kOp = "RopeCache";

const char* scaling_name(RopeScaling s) {
  const internal::ScalingVariant* v = internal::scaling_variant(s);
  return v != nullptr ? v->name : "unknown";
}

void check_config(const RopeConfig& c) {
  using internal::finite_positive;
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0) {
    validate::fail(kOp, "rotary_dim {} must be even and positive", c.rotary_dim);
  }
  if (!finite_positive(c.base)) validate::fail(kOp, "base {} must be finite and positive", c.base);
  if (c.max_positions <= 0) {
    validate::fail(kOp, "max_positions {} must be positive", c.max_positions);
  }
  if (c.max_positions > (INT64_MAX / 8) / c.rotary_dim) {
    validate::fail(kOp, "max_positions {} times rotary_dim {} overflows the table size",
                   c.max_positions, c.rotary_dim);
  }
  if (c.sequence_length < 0) {
    validate::fail(kOp, "sequence_length {} must be non-negative (0: max_positions)",
                   c.sequence_length);
  }
  const internal::ScalingVariant* variant = internal::scaling_variant(c.scaling);
  if (variant == nullptr) {
    validate::fail(kOp, "scaling {} is not a RopeScaling value", static_cast<int>(c.scaling));
  }
  // Fields the chosen variant ignores must keep their defaults: a mistyped configuration
  // fails here instead of silently giving other frequencies.
  const RopeConfig defaults;
  const auto check_unused = [&](const char* field, bool is_default) {
    if (is_default || internal::has_word("rotary_dim base max_positions", field) ||
        internal::has_word(variant->fields, field)) {
      return;
    }
    validate::fail(kOp, "{} is set but scaling {} does not use it", field, variant->name);
  };
#define EMBROPE_CHECK_UNUSED(field) check_unused(#field, c.field == defaults.field);
  EMBROPE_ROPE_CONFIG_VALUES(EMBROPE_CHECK_UNUSED)
  EMBROPE_ROPE_CONFIG_FACTORS(EMBROPE_CHECK_UNUSED)
#undef EMBROPE_CHECK_UNUSED
  variant->check(c);
  if (!std::isfinite(c.attention_factor) || c.attention_factor < 0.0) {
    validate::fail(kOp, "attention_factor {} must be finite and non-negative (0: derived)",
                   c.attention_factor);
  }
}

}  // namespace

RopeFrequencies rope_frequencies(const RopeConfig& config) {
  check_config(config);
  // R/2 float64 frequencies for any even R the checks allow (up to 2^60): one that cannot be
  // held is an out_of_memory error, as a table that cannot be held is, not a std::bad_alloc
  // escaping the API (or, under AddressSanitizer, an abort). Tried once without throwing.
  const auto count = static_cast<std::size_t>(config.rotary_dim / 2);
  if (std::unique_ptr<double[]> probe(new (std::nothrow) double[count]); probe == nullptr) {
    throw Error(ErrorCode::out_of_memory,
                fmt::format("{}: cannot allocate the {} frequencies of rotary_dim {}", kOp, count,
                            config.rotary_dim));
  }
  const internal::ScalingVariant& variant = *internal::scaling_variant(config.scaling);
  RopeFrequencies out;
  out.inv_freq = variant.inv_freq(config);
  out.attention_factor = variant.attention_factor(config);
  const auto last_position = static_cast<double>(config.max_positions - 1);
  for (std::size_t i = 0; i < out.inv_freq.size(); ++i) {
    if (!std::isfinite(out.inv_freq[i]) || out.inv_freq[i] < 0.0) {
      validate::fail(kOp, "scaling {} gives frequency {} = {}, which is not finite and >= 0",
                     scaling_name(config.scaling), i, out.inv_freq[i]);
    }
    // The largest angle of the table must be finite too (else cos and sin are NaN).
    if (!std::isfinite(last_position * out.inv_freq[i])) {
      validate::fail(kOp,
                     "frequency {} = {} times position {} is not a finite angle (base {}, "
                     "scaling {})",
                     i, out.inv_freq[i], config.max_positions - 1, config.base,
                     scaling_name(config.scaling));
    }
  }
  // cos and sin times the factor are stored as float32: it must keep them normal numbers.
  if (!(out.attention_factor >= 1e-30 && out.attention_factor <= 1e30)) {
    validate::fail(kOp,
                   "scaling {} gives attention factor {}, outside [1e-30, 1e30] (cos and sin times "
                   "it must stay normal float32 numbers)",
                   scaling_name(config.scaling), out.attention_factor);
  }
  return out;
}

RopeCache::RopeCache(const RopeConfig& config, Device device, Stream stream)
    : config_(config), device_(device) {
  RopeFrequencies frequencies = rope_frequencies(config);
  validate::check_device_usable(kOp, device);
  build(frequencies.inv_freq, frequencies.attention_factor, stream);
}

RopeCache RopeCache::axial(const std::vector<RopeConfig>& axes, Device device, Stream stream) {
  constexpr int kMaxAxes = static_cast<int>(std::tuple_size_v<decltype(RopeOptions::axes_dim)>);
  if (axes.empty() || axes.size() > static_cast<std::size_t>(kMaxAxes)) {
    validate::fail(kOp, "an axial cache has 1 to {} axes, not {}", kMaxAxes, axes.size());
  }
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
  std::int64_t rotary_dim = 0;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    RopeFrequencies f;
    try {
      f = rope_frequencies(axes[a]);
    } catch (const Error& e) {
      // "RopeCache: rule" becomes "RopeCache: axis a: rule".
      const std::string what = e.what();
      const std::string prefix = std::string(kOp) + ": ";
      const std::string rule = what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
      throw Error(e.code(), fmt::format("{}: axis {}: {}", kOp, a, rule));
    }
    if (axes[a].max_positions != axes[0].max_positions) {
      validate::fail(kOp,
                     "axis {} has max_positions {} but axis 0 has {}; the axes share one table "
                     "of max_positions rows",
                     a, axes[a].max_positions, axes[0].max_positions);
    }
    if (a == 0) attention_factor = f.attention_factor;
    if (f.attention_factor != attention_factor) {
      validate::fail(kOp,
                     "axis {} has attention factor {} but axis 0 has {}; the axes share one "
                     "factor folded into the table",
                     a, f.attention_factor, attention_factor);
    }
    rotary_dim += axes[a].rotary_dim;
    inv_freq.insert(inv_freq.end(), f.inv_freq.begin(), f.inv_freq.end());
  }
  const std::int64_t max_positions = axes[0].max_positions;
  if (max_positions > (INT64_MAX / 8) / rotary_dim) {
    validate::fail(kOp, "max_positions {} times the axes' rotary_dim {} overflows the table size",
                   max_positions, rotary_dim);
  }
  validate::check_device_usable(kOp, device);
  RopeCache cache;
  cache.config_.rotary_dim = rotary_dim;
  cache.config_.max_positions = max_positions;
  cache.axes_ = axes;
  cache.device_ = device;
  cache.build(inv_freq, attention_factor, stream);
  return cache;
}

std::vector<std::int64_t> RopeCache::axes_dim() const {
  std::vector<std::int64_t> dims;
  for (const RopeConfig& axis : axes_) dims.push_back(axis.rotary_dim);
  return dims;
}

// The table of config_.max_positions rows and config_.rotary_dim columns from its frequencies,
// on device_.
void RopeCache::build(const std::vector<double>& inv_freq, double attention_factor, Stream stream) {
  attention_factor_ = attention_factor;
  inv_freq_ = inv_freq;
  const std::vector<double>& f = inv_freq_;
  const RopeConfig& config = config_;
  const auto count = static_cast<std::size_t>(config.max_positions * config.rotary_dim);
  if (device_.kind == DeviceKind::cpu) {
    data_ = new (std::nothrow) float[count];
    if (data_ == nullptr) {
      throw Error(ErrorCode::out_of_memory,
                  fmt::format("{}: cannot allocate {} bytes for {} positions", kOp,
                              count * sizeof(float), config.max_positions));
    }
    cpu::build_rope_cache(data_, config.max_positions, config.rotary_dim, f.data(),
                          attention_factor_);
  } else {
    data_ = static_cast<float*>(gpu::allocate(count * sizeof(float), device_));
    try {
      gpu::build_rope_cache(data_, config.max_positions, config.rotary_dim, f.data(),
                            attention_factor_, device_, stream);
      // Built once, then shared by any stream: wait here so no later call can race the build.
      gpu::synchronize(stream, device_);
    } catch (...) {
      release();
      throw;
    }
  }
}

RopeCache::~RopeCache() {
  release();
}

void RopeCache::release() noexcept {
  if (data_ == nullptr) return;
  if (device_.kind == DeviceKind::cpu) {
    delete[] data_;
  } else {
    gpu::release(data_, device_);
  }
  data_ = nullptr;
}

RopeCache::RopeCache(RopeCache&& other) noexcept
    : config_(other.config_),
      device_(other.device_),
      attention_factor_(other.attention_factor_),
      inv_freq_(std::move(other.inv_freq_)),
      data_(std::exchange(other.data_, nullptr)),
      axes_(std::move(other.axes_)) {}

RopeCache& RopeCache::operator=(RopeCache&& other) noexcept {
  if (this != &other) {
    release();
    config_ = other.config_;
    axes_ = std::move(other.axes_);
    device_ = other.device_;
    attention_factor_ = other.attention_factor_;
    inv_freq_ = std::move(other.inv_freq_);
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

double RopeCache::inv_freq(std::int64_t i) const {
  if (i < 0 || i >= config_.rotary_dim / 2) {
    validate::fail(kOp, "frequency index {} is outside [0, {})", i, config_.rotary_dim / 2);
  }
  return inv_freq_[static_cast<std::size_t>(i)];
}

Tensor RopeCache::table() const {
  return Tensor(data_, DType::float32, {config_.max_positions, config_.rotary_dim}, device_);
}

namespace {
void check_entry(const RopeCache& cache, std::int64_t position, std::int64_t i) {
  if (cache.data() == nullptr) validate::fail(kOp, "the cache was moved from");
  if (cache.device().kind != DeviceKind::cpu) {
    validate::fail(kOp, "cos()/sin() read a CPU cache; use copy_to_host() for a CUDA cache");
  }
  if (position < 0 || position >= cache.max_positions()) {
    validate::fail(kOp, "position {} is outside [0, {})", position, cache.max_positions());
  }
  if (i < 0 || i >= cache.rotary_dim() / 2) {
    validate::fail(kOp, "frequency index {} is outside [0, {})", i, cache.rotary_dim() / 2);
  }
}
}  // namespace

float RopeCache::cos(std::int64_t position, std::int64_t i) const {
  check_entry(*this, position, i);
  return data_[position * config_.rotary_dim + i];
}

float RopeCache::sin(std::int64_t position, std::int64_t i) const {
  check_entry(*this, position, i);
  return data_[position * config_.rotary_dim + config_.rotary_dim / 2 + i];
}

void RopeCache::copy_to_host(float* cos, float* sin) const {
  if (data_ == nullptr) validate::fail(kOp, "the cache was moved from");
  if (cos == nullptr || sin == nullptr) validate::fail(kOp, "copy_to_host needs two buffers");
  const std::int64_t half = config_.rotary_dim / 2;
  const auto count = static_cast<std::size_t>(config_.max_positions * config_.rotary_dim);
  std::vector<float> staging;
  const float* table = data_;
  if (device_.kind != DeviceKind::cpu) {
    staging.resize(count);
    gpu::copy_to_host(staging.data(), data_, count * sizeof(float), device_, Stream{});
    table = staging.data();
  }
  for (std::int64_t p = 0; p < config_.max_positions; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      cos[p * half + i] = table[p * config_.rotary_dim + i];
      sin[p * half + i] = table[p * config_.rotary_dim + half + i];
    }
  }
}

AdaptiveRopeCache::AdaptiveRopeCache(const RopeConfig& config, Device device)
    : config_(config), device_(device) {
  check_config(config);
  validate::check_device_usable(kOp, device);
  if (config.sequence_length != 0) {
    validate::fail("AdaptiveRopeCache", "sequence_length {} must be 0: get() chooses it",
                   config.sequence_length);
  }
}

std::shared_ptr<const RopeCache> AdaptiveRopeCache::get(std::int64_t sequence_length,
                                                        Stream stream) {
  constexpr const char* op = "AdaptiveRopeCache";
  if (sequence_length <= 0)
    validate::fail(op, "sequence_length {} must be positive", sequence_length);
  const std::lock_guard<std::mutex> lock(mutex_);
  RopeConfig c = config_;
  if (config_.scaling == RopeScaling::dynamic) {
    const std::int64_t original = config_.original_max_positions;
    if (cached_length_ == 0) cached_length_ = original;
    // HF dynamic_rope_update: grow past the cached length; reset once back inside the
    // pretrained context (strictly shorter, as there).
    bool rebuild = current_ == nullptr;
    if (sequence_length > cached_length_) {
      cached_length_ = sequence_length;
      rebuild = true;
    } else if (sequence_length < original && cached_length_ > original) {
      cached_length_ = original;
      rebuild = true;
    }
    if (rebuild) {
      c.sequence_length = cached_length_;
      c.max_positions = std::max(config_.max_positions, cached_length_);
      current_ = std::make_shared<const RopeCache>(c, device_, stream);
    }
    return current_;
  }
  if (sequence_length > config_.max_positions) {
    validate::fail(op, "sequence_length {} exceeds max_positions {}", sequence_length,
                   config_.max_positions);
  }
  if (config_.scaling == RopeScaling::longrope) {
    const bool use_long = sequence_length > config_.original_max_positions;
    std::shared_ptr<const RopeCache>& slot = use_long ? long_ : short_;
    if (slot == nullptr) {
      c.sequence_length =
          use_long ? config_.original_max_positions + 1 : config_.original_max_positions;
      slot = std::make_shared<const RopeCache>(c, device_, stream);
    }
    return slot;
  }
  if (current_ == nullptr) current_ = std::make_shared<const RopeCache>(c, device_, stream);
  return current_;
}

EMBROPE_END_NAMESPACE
