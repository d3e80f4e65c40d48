// Helpers shared by the GPU parity suite (tests/gpu/test_*.cpp, one file per op): every op on
// the GPU against the CPU path (the oracle, itself tested against float64 references):
// float32 within 1e-6 relative to the row norm, float16/bfloat16 within one output ulp.
// Outputs are poisoned before each call.
#pragma once

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "embrope/detail/numeric_types.hpp"

namespace gpu_test {

using embrope::Device;
using embrope::DType;
using embrope::Tensor;

inline void cuda_check(cudaError_t e) {
  REQUIRE(e == cudaSuccess);
}

// A host buffer and its device twin.
struct Buffer {
  std::vector<unsigned char> host;
  void* device = nullptr;
  explicit Buffer(std::size_t bytes) : host(bytes) {
    cuda_check(cudaMalloc(&device, bytes == 0 ? 1 : bytes));
  }
  ~Buffer() { cudaFree(device); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void upload() {
    cuda_check(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(host.size());
    cuda_check(cudaMemcpy(out.data(), device, host.size(), cudaMemcpyDeviceToHost));
    return out;
  }
  void poison_both(unsigned char byte) {
    // An empty vector may hold a null pointer, and memset of a null pointer is undefined even
    // for zero bytes.
    if (!host.empty()) std::memset(host.data(), byte, host.size());
    cuda_check(cudaMemset(device, byte, host.size()));
  }
};

// count int64 positions below max_positions, drawn from seed, into b's host copy (not uploaded).
inline void fill_positions(Buffer& b, std::int64_t count, std::int64_t max_positions,
                           std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t p =
        static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(max_positions));
    std::memcpy(b.host.data() + 8 * i, &p, 8);
  }
}

inline float load_value(const unsigned char* base, DType dtype, std::int64_t i) {
  if (dtype == DType::float32) {
    float v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, base + 2 * i, 2);
  return dtype == DType::float16 ? embrope::detail::half_to_float(bits)
                                 : embrope::detail::bfloat16_to_float(bits);
}

inline void store_value(unsigned char* base, DType dtype, std::int64_t i, float v) {
  if (dtype == DType::float32) {
    std::memcpy(base + 4 * i, &v, 4);
    return;
  }
  const std::uint16_t bits = dtype == DType::float16 ? embrope::detail::float_to_half(v)
                                                     : embrope::detail::float_to_bfloat16(v);
  std::memcpy(base + 2 * i, &bits, 2);
}

inline void fill_random(Buffer& b, DType dtype, std::int64_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < count; ++i) store_value(b.host.data(), dtype, i, u(rng));
}

// Element checks run outside Catch2's macros (an INFO or REQUIRE per element costs about a
// microsecond, hours over the sweep): mismatches are counted, the first few described, and
// one assertion made per comparison.
struct Mismatches {
  std::int64_t count = 0;
  std::string first;
  template <typename Describe>
  void check(bool ok, Describe&& describe) {
    if (ok) return;
    if (count < 5) first += describe() + "\n";
    ++count;
  }
  void require() const {
    INFO(count << " mismatches; the first:\n" << first);
    REQUIRE(count == 0);
  }
};

inline std::string where(std::int64_t row, std::int64_t element, double gpu, double cpu) {
  std::ostringstream o;
  o.precision(9);
  o << "row " << row << " element " << element << ": gpu " << gpu << " cpu " << cpu;
  return o.str();
}

// Compares rows of `dim` elements: GPU output against CPU output.
inline void compare_rows(const std::vector<unsigned char>& gpu,
                         const std::vector<unsigned char>& cpu, DType dtype, std::int64_t count,
                         std::int64_t dim) {
  Mismatches mm;
  for (std::int64_t row = 0; row * dim < count; ++row) {
    // Elements left untouched by both (poison, padding) may be NaN or huge: they must match
    // bit for bit and stay out of the norm.
    double norm = 0;
    for (std::int64_t j = 0; j < dim; ++j) {
      const double v = load_value(cpu.data(), dtype, row * dim + j);
      if (std::isfinite(v) && std::fabs(v) < 1e4) norm += v * v;
    }
    norm = std::sqrt(norm);
    const int es = embrope::dtype_size(dtype);
    for (std::int64_t j = 0; j < dim; ++j) {
      const float g = load_value(gpu.data(), dtype, row * dim + j);
      const float c = load_value(cpu.data(), dtype, row * dim + j);
      bool ok;
      if (!std::isfinite(c) || std::fabs(c) >= 1e4) {
        ok = std::memcmp(gpu.data() + (row * dim + j) * es, cpu.data() + (row * dim + j) * es,
                         static_cast<std::size_t>(es)) == 0;
      } else if (!std::isfinite(g)) {
        ok = false;
      } else if (dtype == DType::float32) {
        ok = std::fabs(g - c) <= 1e-6 * (norm + 1e-30) + 1e-30;
      } else {
        // one ulp of the output dtype at the larger magnitude
        const int mantissa = dtype == DType::float16 ? 10 : 7;
        const float m = std::fmax(std::fabs(g), std::fabs(c));
        const float ulp = m == 0 ? 0 : std::ldexp(1.0f, std::ilogb(m) - mantissa);
        ok = std::fabs(g - c) <= ulp + 1e-7f;
      }
      mm.check(ok, [&] { return where(row, j, g, c); });
    }
  }
  mm.require();
}

// RoPE scaling variants at long context, for the cache and the RoPE tests.
inline std::vector<std::pair<const char*, embrope::RopeConfig>> scaled_configs() {
  std::vector<std::pair<const char*, embrope::RopeConfig>> out;
  embrope::RopeConfig c{128, 500000.0, 140000};
  c.scaling = embrope::RopeScaling::llama3;
  c.factor = 8.0;
  c.original_max_positions = 8192;
  out.emplace_back("llama3", c);
  c = embrope::RopeConfig{64, 10000.0, 140000};
  c.scaling = embrope::RopeScaling::yarn;
  c.factor = 40.0;
  c.original_max_positions = 4096;
  c.mscale = c.mscale_all_dim = 0.707;
  out.emplace_back("yarn", c);
  c = embrope::RopeConfig{128, 10000.0, 140000};
  c.scaling = embrope::RopeScaling::linear;
  c.factor = 4.0;
  out.emplace_back("linear", c);
  c.scaling = embrope::RopeScaling::dynamic;
  c.factor = 2.0;
  c.original_max_positions = 4096;
  out.emplace_back("dynamic", c);
  c = embrope::RopeConfig{96, 10000.0, 140000};
  c.scaling = embrope::RopeScaling::longrope;
  c.factor = 32.0;
  c.original_max_positions = 4096;
  for (int i = 0; i < 48; ++i) {
    c.short_factor.push_back(1.0 + 0.05 * i);
    c.long_factor.push_back(1.0 + 1.3 * i);
  }
  out.emplace_back("longrope", c);
  return out;
}

}  // namespace gpu_test
