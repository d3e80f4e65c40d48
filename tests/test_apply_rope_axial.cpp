// Axial RoPE (docs/ops.md, "Axial RoPE") through RopeCache::axial and apply_rope: N axes, each
// owning a slice of the rotary features with its own frequencies base_a^(-2j / d_a), and a
// position stream per axis. Against float64 references written from those formulas, with the
// properties that one axis is plain RoPE bit for bit and that the cache and a caller's table
// agree; bad coordinates and argument errors.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apply_rope_cases.hpp"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DeferredStatus;
using embrope::DType;
using embrope::ErrorCode;
using embrope::RopeCache;
using embrope::RopeConfig;
using embrope::RopeLayout;
using embrope::RopeOptions;
using op_cases::AxialCase;

std::vector<RopeConfig> axis_configs(const AxialCase& c) {
  std::vector<RopeConfig> axes;
  for (std::size_t a = 0; a < c.axes_dim.size() && c.axes_dim[a] != 0; ++a) {
    axes.push_back(RopeConfig{c.axes_dim[a], c.bases[a], c.max_positions});
  }
  return axes;
}

// Axis a's feature slice and its frequency j, written from the axes list: pair i belongs to
// the axis whose cumulative pair range holds it.
void axis_of(const AxialCase& c, std::int64_t i, std::size_t* axis, std::int64_t* j) {
  std::int64_t first = 0;
  for (std::size_t a = 0; a < c.axes_dim.size(); ++a) {
    if (i < first + c.axes_dim[a] / 2) {
      *axis = a;
      *j = i - first;
      return;
    }
    first += c.axes_dim[a] / 2;
  }
  FAIL("pair " << i << " past every axis");
}

void run_axial(const AxialCase& c) {
  const std::vector<RopeConfig> axes = axis_configs(c);
  const auto n_axes = static_cast<std::int64_t>(axes.size());
  std::int64_t rotary = 0;
  for (const RopeConfig& a : axes) rotary += a.rotary_dim;
  const std::int64_t tokens = (c.batch == 0 ? 1 : c.batch) * c.seq;
  const std::int64_t d = c.head_dim;
  ref::Buffer q(c.dtype, tokens * c.hq * d), k(c.dtype, tokens * c.hk * d);
  ref::Buffer q_out(c.dtype, tokens * c.hq * d), k_out(c.dtype, tokens * c.hk * d);
  ref::Buffer pos(c.pos_dtype, n_axes * tokens);
  const auto seed = ref::seed_of({static_cast<int>(c.dtype), c.interleaved, rotary, c.batch,
                                  c.positions_token_major, n_axes, c.inverse});
  ref::fill_random(q, seed);
  ref::fill_random(k, seed + 1);
  ref::fill_random_indices(pos, seed + 2, 0, c.max_positions - 1);
  ref::poison(q_out);
  ref::poison(k_out);
  const ref::Buffer q0 = q, k0 = k;

  std::vector<std::int64_t> token_shape =
      c.batch == 0 ? std::vector<std::int64_t>{c.seq} : std::vector<std::int64_t>{c.batch, c.seq};
  auto with = [&](std::vector<std::int64_t> s, std::int64_t h) {
    s.push_back(h);
    s.push_back(d);
    return s;
  };
  // positions [N, tokens...]: axis-major, or token-major (Flux's ids [T, N]) viewed through
  // strides.
  std::vector<std::int64_t> pos_shape = {n_axes};
  pos_shape.insert(pos_shape.end(), token_shape.begin(), token_shape.end());
  embrope::Tensor pos_view = ref::view(pos, 0, pos_shape);
  if (c.positions_token_major) {
    std::vector<std::int64_t> strides(pos_shape.size(), 1);
    std::int64_t s = n_axes;
    for (std::size_t a = pos_shape.size() - 1; a >= 1; --a) {
      strides[a] = s;
      s *= pos_shape[a];
    }
    pos_view = ref::view(pos, 0, pos_shape, strides);
  }
  auto position = [&](std::int64_t t, std::size_t axis) {
    const auto a = static_cast<std::int64_t>(axis);
    return c.positions_token_major ? pos.get_index(t * n_axes + a) : pos.get_index(a * tokens + t);
  };

  const RopeCache cache = RopeCache::axial(axes);
  RopeOptions opt;
  opt.layout = c.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  opt.inverse = c.inverse;
  if (c.out_of_place) {
    opt.q_out = ref::view(q_out, 0, with(token_shape, c.hq));
    opt.k_out = ref::view(k_out, 0, with(token_shape, c.hk));
  }
  embrope::apply_rope(ref::view(q, 0, with(token_shape, c.hq)),
                      ref::view(k, 0, with(token_shape, c.hk)), pos_view, cache, opt);

  ref::Mismatches m;
  for (const bool is_q : {true, false}) {
    const std::int64_t heads = is_q ? c.hq : c.hk;
    const ref::Buffer& in = is_q ? q0 : k0;
    const ref::Buffer& out = c.out_of_place ? (is_q ? q_out : k_out) : (is_q ? q : k);
    if (c.out_of_place) CHECK((is_q ? q : k).snapshot() == in.snapshot());
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<double> cv(static_cast<std::size_t>(rotary / 2)), sv(cv.size());
      for (std::int64_t i = 0; i < rotary / 2; ++i) {
        std::size_t axis = 0;
        std::int64_t j = 0;
        axis_of(c, i, &axis, &j);
        const double angle = static_cast<double>(position(t, axis)) *
                             std::pow(c.bases[axis], -2.0 * static_cast<double>(j) /
                                                         static_cast<double>(c.axes_dim[axis]));
        cv[static_cast<std::size_t>(i)] = std::cos(angle);
        sv[static_cast<std::size_t>(i)] = std::sin(angle);
      }
      ref::expect_rotated_token(m, is_q ? "q" : "k", in, out, t, heads, d, rotary, c.interleaved,
                                c.inverse, cv, sv, c.dtype);
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

}  // namespace

TEST_CASE("an axial cache holds each axis's cos and sin, rounded once from float64",
          "[rope][axial][cache]") {
  // Flux.1's axes_dim [16, 56, 56], and three different bases.
  const std::array<std::int64_t, 3> dims = {16, 56, 56};
  for (const std::array<double, 3>& bases :
       {std::array<double, 3>{10000.0, 10000.0, 10000.0}, {100.0, 10000.0, 256.0}}) {
    const std::int64_t rows = 70;
    std::vector<RopeConfig> axes;
    for (std::size_t a = 0; a < 3; ++a) axes.push_back(RopeConfig{dims[a], bases[a], rows});
    const RopeCache cache = RopeCache::axial(axes);
    CHECK(cache.rotary_dim() == 128);
    CHECK(cache.max_positions() == rows);
    CHECK(cache.axes_dim() == std::vector<std::int64_t>{16, 56, 56});
    CHECK(cache.axes().size() == 3);
    std::int64_t mismatches = 0;
    for (std::int64_t p = 0; p < rows; ++p) {
      std::int64_t i = 0;
      for (std::size_t a = 0; a < 3; ++a) {
        for (std::int64_t j = 0; j < dims[a] / 2; ++j, ++i) {
          const double angle =
              static_cast<double>(p) *
              std::pow(bases[a], -2.0 * static_cast<double>(j) / static_cast<double>(dims[a]));
          mismatches += cache.cos(p, i) != static_cast<float>(std::cos(angle));
          mismatches += cache.sin(p, i) != static_cast<float>(std::sin(angle));
        }
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("axial RoPE takes each pair's angle from its axis's coordinate and frequencies",
          "[rope][axial]") {
  AxialCase c;
  c.dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  INFO("dtype " << static_cast<int>(c.dtype));
  SECTION("Flux.1: axes_dim [16, 56, 56], adjacent pairs, ids token-major [T, 3]") {
    c.axes_dim = {16, 56, 56, 0};
    c.interleaved = true;
    c.positions_token_major = true;
    run_axial(c);
  }
  SECTION("Qwen2-VL's vision tower: head dim 80, axes [40, 40], rotate-half pairs, [B, S]") {
    c.head_dim = 80;
    c.axes_dim = {40, 40, 0, 0};
    c.batch = 2;
    c.seq = 5;
    c.pos_dtype = DType::int32;
    run_axial(c);
  }
  SECTION("Wan 2.1: head dim 128, axes [44, 42, 42], out of place, inverse") {
    c.axes_dim = {44, 42, 42, 0};
    c.interleaved = true;
    c.out_of_place = true;
    c.inverse = true;
    run_axial(c);
  }
  SECTION("four axes (FLUX.2 [32, 32, 32, 32]), bases differing per axis") {
    c.axes_dim = {32, 32, 32, 32};
    c.bases = {2000.0, 10000.0, 10000.0, 500.0};
    c.interleaved = true;
    run_axial(c);
  }
  SECTION("a ViT's head dim 72 rotated in part: axes [16, 16] of 72") {
    c.head_dim = 72;
    c.axes_dim = {16, 16, 0, 0};
    c.hq = 3;
    c.hk = 3;
    run_axial(c);
  }
  SECTION("head dims 64, 88 and 96 with two axes") {
    for (const std::int64_t d : {64, 88, 96}) {
      c.head_dim = d;
      c.axes_dim = {d / 2, d / 2, 0, 0};
      run_axial(c);
    }
  }
}

TEST_CASE("axial RoPE with one axis is plain RoPE, and a caller's table equals the cache",
          "[rope][axial][property]") {
  const std::int64_t t = 6, h = 3, d = 96;
  ref::Buffer q(DType::bfloat16, t * h * d), pos(DType::int64, 2 * t);
  ref::fill_random(q, 177);
  ref::fill_random_indices(pos, 178, 0, 255);
  {
    const RopeCache plain_cache(RopeConfig{d, 10000.0, 256});
    const RopeCache axial_cache = RopeCache::axial({RopeConfig{d, 10000.0, 256}});
    ref::Buffer plain = q, axial = q;
    // positions [1, T] in a buffer of exactly T (AddressSanitizer sees a read of a second
    // stream).
    ref::Buffer one_axis(DType::int64, t);
    for (std::int64_t i = 0; i < t; ++i) one_axis.set_index(i, pos.get_index(i));
    embrope::apply_rope(ref::view(plain, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}),
                        plain_cache);
    embrope::apply_rope(ref::view(axial, 0, {t, h, d}), std::nullopt,
                        ref::view(one_axis, 0, {1, t}), axial_cache);
    CHECK(axial.snapshot() == plain.snapshot());
  }
  // Two axes from the cache against the cache's own table handed in as cos and sin with
  // axes_dim: the same rotation, bit for bit.
  const RopeCache cache = RopeCache::axial({RopeConfig{32, 10000.0, 256}, {64, 100.0, 256}});
  std::vector<float> cos(256 * 48), sin(256 * 48);
  cache.copy_to_host(cos.data(), sin.data());
  const embrope::Tensor cos_t(cos.data(), DType::float32, {256, 48});
  const embrope::Tensor sin_t(sin.data(), DType::float32, {256, 48});
  ref::Buffer from_cache = q, from_table = q;
  embrope::apply_rope(ref::view(from_cache, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {2, t}),
                      cache);
  RopeOptions opt;
  opt.axes_dim = {32, 64, 0, 0};
  embrope::apply_rope(ref::view(from_table, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {2, t}),
                      cos_t, sin_t, opt);
  CHECK(from_table.snapshot() == from_cache.snapshot());
  // The gradient rotates back: forward then backward is the identity up to rounding.
  ref::Buffer round_trip(DType::float32, t * h * d);
  ref::fill_random(round_trip, 179);
  const ref::Buffer x0 = round_trip;
  embrope::apply_rope(ref::view(round_trip, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {2, t}),
                      cache);
  embrope::apply_rope_backward(ref::view(round_trip, 0, {t, h, d}), std::nullopt,
                               ref::view(pos, 0, {2, t}), cache);
  double worst = 0.0;
  for (std::int64_t e = 0; e < t * h * d; ++e) {
    worst = std::max(worst, std::fabs(round_trip.get(e) - x0.get(e)));
  }
  CHECK(worst < 1e-5);
}

TEST_CASE("axial RoPE leaves a prefix of tokens unrotated through a view that skips it",
          "[rope][axial]") {
  // A ViT's class and register tokens (the first 5 of each image) keep their features: the call
  // takes q[:, 5:], a strided view, and positions for the patches only.
  const std::int64_t b = 2, s = 12, prefix = 5, h = 2, d = 64;
  const RopeCache cache = RopeCache::axial({RopeConfig{32, 100.0, 16}, {32, 100.0, 16}});
  ref::Buffer q(DType::float32, b * s * h * d), pos(DType::int64, 2 * b * (s - prefix));
  ref::fill_random(q, 191);
  ref::fill_random_indices(pos, 192, 0, 15);
  const ref::Buffer q0 = q;
  embrope::apply_rope(ref::view(q, prefix * h * d, {b, s - prefix, h, d}, {s * h * d, h * d, d, 1}),
                      std::nullopt, ref::view(pos, 0, {2, b, s - prefix}), cache);
  for (std::int64_t bb = 0; bb < b; ++bb) {
    for (std::int64_t e = 0; e < prefix * h * d; ++e) {
      CHECK(q.get(bb * s * h * d + e) == q0.get(bb * s * h * d + e));
    }
    bool changed = false;
    for (std::int64_t e = prefix * h * d; e < s * h * d; ++e) {
      changed = changed || q.get(bb * s * h * d + e) != q0.get(bb * s * h * d + e);
    }
    CHECK(changed);
  }
}

TEST_CASE("axial RoPE: a bad coordinate on any axis zero-fills the token and is reported",
          "[rope][axial][errors]") {
  const std::int64_t t = 4, h = 2, d = 64;
  const RopeCache cache =
      RopeCache::axial({RopeConfig{16, 10000.0, 50}, {24, 10000.0, 50}, {24, 10000.0, 50}});
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, 3 * t);
  ref::fill_random(q, 181);
  ref::fill_random_indices(pos, 182, 0, 49);
  pos.set_index(2 * t + 1, 50);  // axis 2 of token 1
  const ref::Buffer q0 = q;
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                            cache);
      },
      {ErrorCode::index_out_of_range}, {"apply_rope", "50"});
  for (std::int64_t e = 0; e < h * d; ++e) CHECK(q.get(h * d + e) == 0.0);
  bool changed = false;
  for (std::int64_t e = 0; e < h * d; ++e) changed = changed || q.get(e) != q0.get(e);
  CHECK(changed);
  DeferredStatus status;
  RopeOptions opt;
  opt.deferred = &status;
  embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}), cache,
                      opt);
  expect_error([&] { status.check(); }, {ErrorCode::index_out_of_range}, {"apply_rope", "50"});
}

TEST_CASE("axial RoPE rejects axes, positions and caches that do not fit",
          "[rope][axial][errors]") {
  const std::int64_t t = 4, h = 2, d = 64;
  const RopeCache cache = RopeCache::axial({RopeConfig{32, 10000.0, 50}, {32, 10000.0, 50}});
  const RopeCache plain(RopeConfig{64, 10000.0, 50});
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, 4 * t);
  ref::fill_random(q, 183);
  ref::fill_random_indices(pos, 184, 0, 49);
  const auto call = [&](const RopeCache& c, std::int64_t streams, const RopeOptions& opt) {
    return [&, streams] {
      embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {streams, t}),
                          c, opt);
    };
  };
  RopeOptions opt;
  expect_error(call(cache, 3, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "positions", "2 axes", "[32, 32]"});
  opt.axes_dim = {16, 48, 0, 0};
  expect_error(call(cache, 2, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "axes_dim [16, 48, 0, 0]", "[32, 32, 0, 0]", "the cache"});
  opt.axes_dim = {31, 33, 0, 0};
  expect_error(call(plain, 2, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "axis 0 has 31 features", "positive even"});
  opt.axes_dim = {32, 0, 32, 0};
  expect_error(call(plain, 2, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "axis 1 has 0 features", "trailing zeros"});
  opt.axes_dim = {32, 16, 0, 0};
  expect_error(call(plain, 2, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "sums to 48", "rotary dim of the cache is 64"});
  // Sizes whose sum overflows int64 are refused before they are added.
  opt.axes_dim = {INT64_MAX - 1, INT64_MAX - 1, 0, 0};
  expect_error(call(plain, 2, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "sums to more than the rotary dim 64"});
  opt.axes_dim = {};
  opt.mrope_section = {16, 8, 8};
  expect_error(call(cache, 3, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "mrope_section", "one or the other"});
  opt.mrope_section = {};
  opt.axes_dim = {32, 32, 0, 0};
  opt.mrope_interleaved = true;
  expect_error(call(plain, 2, opt), {ErrorCode::invalid_argument},
               {"apply_rope", "mrope_interleaved", "contiguous"});

  // The cache's own rules name the axis.
  expect_error([] { RopeCache::axial({}); }, {ErrorCode::invalid_argument},
               {"RopeCache", "1 to 4 axes, not 0"});
  expect_error(
      [] {
        RopeCache::axial(
            {RopeConfig{8, 1e4, 9}, {8, 1e4, 9}, {8, 1e4, 9}, {8, 1e4, 9}, {8, 1e4, 9}});
      },
      {ErrorCode::invalid_argument}, {"RopeCache", "1 to 4 axes, not 5"});
  expect_error(
      [] {
        RopeCache::axial({RopeConfig{8, 1e4, 9}, {7, 1e4, 9}});
      },
      {ErrorCode::invalid_argument}, {"RopeCache: axis 1: rotary_dim 7"});
  expect_error(
      [] {
        RopeCache::axial({RopeConfig{8, 1e4, 9}, {8, 1e4, 10}});
      },
      {ErrorCode::invalid_argument}, {"RopeCache", "axis 1 has max_positions 10"});
  RopeConfig yarn{8, 1e4, 64};
  yarn.scaling = embrope::RopeScaling::yarn;
  yarn.factor = 4.0;
  yarn.original_max_positions = 16;
  expect_error(
      [&] {
        RopeCache::axial({RopeConfig{8, 1e4, 64}, yarn});
      },
      {ErrorCode::invalid_argument}, {"RopeCache", "axis 1 has attention factor"});
}
