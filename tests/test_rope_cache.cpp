// RopeCache (docs/ops.md, "RopeCache"): every value is the float32 rounding of the float64 cos and
// sin of p * base^(-2i/R); the table's layout; argument errors; moved-from caches.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <limits>
#include <utility>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"

namespace {

using embrope::Device;
using embrope::DType;
using embrope::Error;
using embrope::ErrorCode;
using embrope::RopeCache;
using embrope::RopeConfig;

// Distance in float32 ulps between two finite floats (through their ordered bit patterns).
std::int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    std::int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? static_cast<std::int64_t>(INT32_MIN) - i : static_cast<std::int64_t>(i);
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Checks cache rows [first, last) against the float64 reference: each value must be the
// float32 rounding of the float64 value, up to one float32 ulp (the float64 libm's error).
void check_rows(const RopeCache& cache, double base, std::int64_t first, std::int64_t last,
                std::int64_t step, ref::Mismatches& m) {
  const std::int64_t r = cache.rotary_dim();
  for (std::int64_t p = first; p < last; p += step) {
    for (std::int64_t i = 0; i < r / 2; ++i) {
      const double angle = static_cast<double>(p) * ref::rope_inv_freq(i, r, base);
      const auto want_c = static_cast<float>(std::cos(angle));
      const auto want_s = static_cast<float>(std::sin(angle));
      const float got_c = cache.cos(p, i);
      const float got_s = cache.sin(p, i);
      ++m.checked;
      if (std::isnan(got_c) || std::isnan(got_s) || ulp_distance(got_c, want_c) > 1 ||
          ulp_distance(got_s, want_s) > 1) {
        m.fail(ref::where("cos/sin", {p, i}) + ": got " + std::to_string(got_c) + "/" +
               std::to_string(got_s) + ", expected " + std::to_string(want_c) + "/" +
               std::to_string(want_s));
      }
    }
  }
}

}  // namespace

TEST_CASE("RopeCache holds the correctly rounded float64 cos and sin of p * base^(-2i/R)",
          "[rope_cache]") {
  struct Config {
    std::int64_t rotary_dim;
    double base;
    std::int64_t max_positions;
  };
  const Config c = GENERATE(Config{2, 10000.0, 7}, Config{64, 10000.0, 4096},
                            Config{128, 500000.0, 1024}, Config{6, 1.5, 300}, Config{16, 0.25, 100},
                            Config{80, 1e6, 2048}, Config{96, 10000.0, 1});
  INFO("rotary_dim " << c.rotary_dim << " base " << c.base << " max_positions " << c.max_positions);
  const RopeCache cache(RopeConfig{c.rotary_dim, c.base, c.max_positions});
  CHECK(cache.rotary_dim() == c.rotary_dim);
  CHECK(cache.max_positions() == c.max_positions);
  CHECK(cache.config().base == c.base);
  CHECK(cache.device() == Device::cpu());
  CHECK(cache.attention_factor() == 1.0);
  ref::Mismatches m;
  check_rows(cache, c.base, 0, c.max_positions, 1, m);
  INFO(m.summary());
  CHECK(m.checked == c.max_positions * c.rotary_dim / 2);
  CHECK(m.count == 0);
  // Position 0 is the identity rotation, exactly.
  for (std::int64_t i = 0; i < c.rotary_dim / 2; ++i) {
    CHECK(cache.cos(0, i) == 1.0f);
    CHECK(cache.sin(0, i) == 0.0f);
  }
}

TEST_CASE("RopeCache stays correctly rounded at positions up to 2^20", "[rope_cache]") {
  const std::int64_t max_positions = std::int64_t{1} << 20;
  const RopeCache cache(RopeConfig{8, 10000.0, max_positions});
  ref::Mismatches m;
  check_rows(cache, 10000.0, 0, max_positions, 1021, m);
  check_rows(cache, 10000.0, max_positions - 64, max_positions, 1, m);
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(m.checked > 1000);
}

TEST_CASE("RopeCache::inv_freq is base^(-2i/R) in float64", "[rope_cache]") {
  const double base = GENERATE(10000.0, 500000.0, 2.0, 0.5);
  const std::int64_t r = GENERATE(2, 64, 80, 128);
  const RopeCache cache(RopeConfig{r, base, 4});
  CHECK(cache.inv_freq(0) == 1.0);
  for (std::int64_t i = 0; i < r / 2; ++i) {
    const double want = ref::rope_inv_freq(i, r, base);
    INFO("i " << i << " base " << base << " R " << r);
    CHECK(std::fabs(cache.inv_freq(i) - want) <= 4 * std::numeric_limits<double>::epsilon() * want);
  }
}

TEST_CASE("RopeCache::table is a [max_positions, rotary_dim] float32 view: cos then sin",
          "[rope_cache]") {
  const std::int64_t r = 10, n = 33;
  const RopeCache cache(RopeConfig{r, 10000.0, n});
  const embrope::Tensor t = cache.table();
  REQUIRE(t.ndim() == 2);
  CHECK(t.shape(0) == n);
  CHECK(t.shape(1) == r);
  CHECK(t.stride(0) == r);
  CHECK(t.stride(1) == 1);
  CHECK(t.dtype() == DType::float32);
  CHECK(t.device() == Device::cpu());
  CHECK(t.data() == static_cast<const void*>(cache.data()));
  const float* table = cache.data();
  REQUIRE(table != nullptr);
  std::int64_t wrong = 0;
  for (std::int64_t p = 0; p < n; ++p) {
    for (std::int64_t i = 0; i < r / 2; ++i) {
      if (bits_of(table[p * r + i]) != bits_of(cache.cos(p, i))) ++wrong;
      if (bits_of(table[p * r + r / 2 + i]) != bits_of(cache.sin(p, i))) ++wrong;
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("RopeCache::copy_to_host writes row-major [position][i] cos and sin arrays",
          "[rope_cache]") {
  const std::int64_t r = 12, n = 21;
  const RopeCache cache(RopeConfig{r, 10000.0, n});
  std::vector<float> cos_h(static_cast<std::size_t>(n * r / 2),
                           std::numeric_limits<float>::quiet_NaN());
  std::vector<float> sin_h(cos_h);
  cache.copy_to_host(cos_h.data(), sin_h.data());
  std::int64_t wrong = 0;
  for (std::int64_t p = 0; p < n; ++p) {
    for (std::int64_t i = 0; i < r / 2; ++i) {
      const auto k = static_cast<std::size_t>(p * (r / 2) + i);
      const double angle = static_cast<double>(p) * ref::rope_inv_freq(i, r, 10000.0);
      if (ulp_distance(cos_h[k], static_cast<float>(std::cos(angle))) > 1) ++wrong;
      if (ulp_distance(sin_h[k], static_cast<float>(std::sin(angle))) > 1) ++wrong;
      if (bits_of(cos_h[k]) != bits_of(cache.cos(p, i))) ++wrong;
      if (bits_of(sin_h[k]) != bits_of(cache.sin(p, i))) ++wrong;
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("RopeCache rejects bad configurations with a message naming the field",
          "[rope_cache][errors]") {
  struct Bad {
    RopeConfig config;
    const char* field;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const Bad bad = GENERATE_COPY(
      Bad{RopeConfig{3, 10000.0, 16}, "rotary_dim"}, Bad{RopeConfig{0, 10000.0, 16}, "rotary_dim"},
      Bad{RopeConfig{-2, 10000.0, 16}, "rotary_dim"},
      Bad{RopeConfig{127, 10000.0, 16}, "rotary_dim"}, Bad{RopeConfig{64, 0.0, 16}, "base"},
      Bad{RopeConfig{64, -10000.0, 16}, "base"}, Bad{RopeConfig{64, nan, 16}, "base"},
      Bad{RopeConfig{64, inf, 16}, "base"}, Bad{RopeConfig{64, 10000.0, 0}, "max_positions"},
      Bad{RopeConfig{64, 10000.0, -5}, "max_positions"});
  INFO("rotary_dim " << bad.config.rotary_dim << " base " << bad.config.base << " max_positions "
                     << bad.config.max_positions);
  REQUIRE_THROWS_AS(RopeCache(bad.config), Error);
  REQUIRE_THROWS_WITH(RopeCache(bad.config),
                      Catch::Contains("RopeCache") && Catch::Contains(bad.field));
  try {
    RopeCache cache(bad.config);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
  }
}

TEST_CASE("RopeCache::cos and sin reject indices outside the table", "[rope_cache][errors]") {
  const RopeCache cache(RopeConfig{8, 10000.0, 5});
  CHECK_NOTHROW(cache.cos(4, 3));
  CHECK_NOTHROW(cache.sin(4, 3));
  struct Index {
    std::int64_t position, i;
  };
  const Index idx = GENERATE(Index{-1, 0}, Index{5, 0}, Index{0, -1}, Index{0, 4},
                             Index{INT64_MAX, 0}, Index{0, INT64_MIN});
  INFO("position " << idx.position << " i " << idx.i);
  CHECK_THROWS_AS(cache.cos(idx.position, idx.i), Error);
  if (idx.position == 0) CHECK_THROWS_AS(cache.inv_freq(idx.i), Error);
  CHECK_THROWS_AS(cache.sin(idx.position, idx.i), Error);
  CHECK_THROWS_WITH(cache.cos(idx.position, idx.i), Catch::Contains("RopeCache"));
  try {
    (void)cache.sin(idx.position, idx.i);
  } catch (const Error& e) {
    CHECK((e.code() == ErrorCode::index_out_of_range || e.code() == ErrorCode::invalid_argument));
  }
}

TEST_CASE("a moved-from RopeCache is empty and rejected, and the destination owns the table",
          "[rope_cache][errors]") {
  const double inv_freq_1 = ref::rope_inv_freq(1, 16, 10000.0);
  RopeCache a(RopeConfig{16, 10000.0, 9});
  const float* table = a.data();
  const float cos_81 = static_cast<float>(std::cos(8 * inv_freq_1));

  SECTION("move construction") {
    RopeCache b(std::move(a));
    CHECK(b.data() == table);
    CHECK(b.rotary_dim() == 16);
    CHECK(b.max_positions() == 9);
    CHECK(ulp_distance(b.cos(8, 1), cos_81) <= 1);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
    CHECK_THROWS_AS(a.cos(0, 0), Error);
    std::vector<float> c(16 * 9), s(16 * 9);
    CHECK_THROWS_AS(a.copy_to_host(c.data(), s.data()), Error);

    // apply_rope with the moved-from cache fails cleanly.
    ref::Buffer q(DType::float32, 16);
    ref::fill_random(q, 7);
    ref::Buffer pos(DType::int64, 1);
    pos.set_index(0, 3);
    const auto before = q.snapshot();
    try {
      embrope::apply_rope(ref::view(q, 0, {1, 1, 16}), std::nullopt, ref::view(pos, 0, {1}), a);
      FAIL("apply_rope accepted a moved-from cache");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("apply_rope"));
    }
    CHECK(q.snapshot() == before);
  }
  SECTION("move assignment") {
    RopeCache b(RopeConfig{4, 10000.0, 2});
    b = std::move(a);
    CHECK(b.data() == table);
    CHECK(b.rotary_dim() == 16);
    CHECK(ulp_distance(b.cos(8, 1), cos_81) <= 1);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move)
    CHECK_THROWS_AS(a.sin(0, 0), Error);
  }
}

TEST_CASE("a CUDA RopeCache without a usable GPU is a clear error", "[rope_cache][errors]") {
  if (embrope::cuda_device_count() > 0) {
    WARN("a GPU is present: the no-GPU error path is not exercised here");
    return;
  }
  try {
    RopeCache cache(RopeConfig{64, 10000.0, 16}, Device::cuda(0));
    FAIL("a CUDA cache was built without a GPU");
  } catch (const Error& e) {
    CHECK((e.code() == ErrorCode::not_implemented || e.code() == ErrorCode::invalid_argument));
    CHECK_THAT(e.what(), Catch::Contains("RopeCache"));
  }
}

// A rotary dim the size checks accept (the table of one position is within 2^60 elements)
// but whose frequencies cannot be held: an out_of_memory error naming the op, from the cache
// and from rope_frequencies alike, never std::bad_alloc (nor an abort under AddressSanitizer).
TEST_CASE("a rotary dim too large to hold its frequencies is an out_of_memory error",
          "[rope_cache][errors]") {
  RopeConfig config;
  config.rotary_dim = std::int64_t{1} << 59;
  config.max_positions = 1;
  for (int via_cache = 0; via_cache < 2; ++via_cache) {
    try {
      if (via_cache) {
        RopeCache cache(config);
      } else {
        embrope::rope_frequencies(config);
      }
      FAIL("no error for 2^58 frequencies");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::out_of_memory);
      CHECK(std::string(e.what()).find("RopeCache: cannot allocate the 288230376151711744 "
                                       "frequencies of rotary_dim 576460752303423488") == 0);
    }
  }
}
