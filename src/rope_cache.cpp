// RopeCache: validation of the configuration, the frequencies, and dispatch of the build.
#include "embrope/rope_cache.hpp"

#include <cmath>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "embrope/detail/rope_math.hpp"
#include "embrope/error.hpp"
#include "validate.hpp"

namespace embrope {
namespace {

constexpr const char* kOp = "RopeCache";

void check_config(const RopeConfig& c) {
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0) {
    validate::fail(kOp, "rotary_dim {} must be even and positive", c.rotary_dim);
  }
  if (!(std::isfinite(c.base) && c.base > 0.0)) {
    validate::fail(kOp, "base {} must be finite and positive", c.base);
  }
  if (c.max_positions <= 0) {
    validate::fail(kOp, "max_positions {} must be positive", c.max_positions);
  }
  if (c.max_positions > (INT64_MAX / 8) / c.rotary_dim) {
    validate::fail(kOp, "max_positions {} times rotary_dim {} overflows the table size",
                   c.max_positions, c.rotary_dim);
  }
}

std::vector<double> inv_freqs(const RopeConfig& c) {
  std::vector<double> f(static_cast<std::size_t>(c.rotary_dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = detail::rope_inv_freq(static_cast<std::int64_t>(i), c.rotary_dim, c.base);
  }
  return f;
}

}  // namespace

RopeCache::RopeCache(const RopeConfig& config, Device device, Stream stream)
    : config_(config), device_(device) {
  check_config(config);
  validate::check_device_usable(kOp, device);
  const std::vector<double> f = inv_freqs(config);
  // A finite base can still give infinite frequencies (a base near the smallest double):
  // every angle would then be NaN.
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (!std::isfinite(f[i])) {
      validate::fail(kOp, "base {} gives a non-finite frequency inv_freq_{} = {}", config.base, i,
                     f[i]);
    }
  }
  const auto count = static_cast<std::size_t>(config.max_positions * config.rotary_dim);
  if (device.kind == DeviceKind::cpu) {
    data_ = new (std::nothrow) float[count];
    if (data_ == nullptr) {
      throw Error(ErrorCode::out_of_memory,
                  fmt::format("{}: cannot allocate {} bytes for {} positions", kOp,
                              count * sizeof(float), config.max_positions));
    }
    cpu::build_rope_cache(data_, config.max_positions, config.rotary_dim, f.data(),
                          attention_factor_);
  } else {
    data_ = static_cast<float*>(cuda::allocate(count * sizeof(float), device));
    try {
      cuda::build_rope_cache(data_, config.max_positions, config.rotary_dim, f.data(),
                             attention_factor_, device, stream);
      // Built once, then shared by any stream: wait here so no later call can race the build.
      cuda::synchronize(stream, device);
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
    cuda::release(data_, device_);
  }
  data_ = nullptr;
}

RopeCache::RopeCache(RopeCache&& other) noexcept
    : config_(other.config_),
      device_(other.device_),
      attention_factor_(other.attention_factor_),
      data_(std::exchange(other.data_, nullptr)) {}

RopeCache& RopeCache::operator=(RopeCache&& other) noexcept {
  if (this != &other) {
    release();
    config_ = other.config_;
    device_ = other.device_;
    attention_factor_ = other.attention_factor_;
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

double RopeCache::inv_freq(std::int64_t i) const {
  if (i < 0 || i >= config_.rotary_dim / 2) {
    validate::fail(kOp, "frequency index {} is outside [0, {})", i, config_.rotary_dim / 2);
  }
  return detail::rope_inv_freq(i, config_.rotary_dim, config_.base);
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
    cuda::copy_to_host(staging.data(), data_, count * sizeof(float), device_, Stream{});
    table = staging.data();
  }
  for (std::int64_t p = 0; p < config_.max_positions; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      cos[p * half + i] = table[p * config_.rotary_dim + i];
      sin[p * half + i] = table[p * config_.rotary_dim + half + i];
    }
  }
}

}  // namespace embrope
