// Multimodal RoPE (Qwen2-VL mrope_section, docs/ops.md) through apply_rope: three position
// streams, frequency i takes its angle from the stream of the section holding i. Against the
// float64 reference, with the property that equal streams give plain RoPE bit for bit, bad
// positions in any stream, and argument errors.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
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
using op_cases::MropeCase;

// Stream j of frequency i, written from the section list (cumulative bounds).
int stream_of(const std::array<std::int64_t, 3>& section, std::int64_t i) {
  std::int64_t end = 0;
  for (int j = 0; j < 3; ++j) {
    end += section[static_cast<std::size_t>(j)];
    if (i < end) return j;
  }
  return 2;
}

// The streams of frequencies 0 .. half-1 interleaved as HF's Qwen3-VL recomposes them
// (Qwen3VLTextRotaryEmbedding.recomposition_frequencies): all temporal, then for stream 1
// (offset 1) and stream 2 (offset 2) the slice [offset : 3 * section[stream] : 3] overwritten.
std::vector<int> interleaved_streams(const std::array<std::int64_t, 3>& section,
                                     std::int64_t half) {
  std::vector<int> stream(static_cast<std::size_t>(half), 0);
  for (int j = 1; j <= 2; ++j) {
    const std::int64_t end = std::min(half, 3 * section[static_cast<std::size_t>(j)]);
    for (std::int64_t i = j; i < end; i += 3) stream[static_cast<std::size_t>(i)] = j;
  }
  return stream;
}

void run_mrope(const MropeCase& c) {
  const std::int64_t tokens = (c.batch == 0 ? 1 : c.batch) * c.seq;
  const std::int64_t d = c.head_dim;
  ref::Buffer q(c.dtype, tokens * c.hq * d), k(c.dtype, tokens * c.hk * d);
  ref::Buffer pos(c.pos_dtype, 3 * tokens);
  const auto seed = ref::seed_of({static_cast<int>(c.dtype), c.interleaved, c.rotary_dim,
                                  c.section[0], c.batch, c.positions_token_major});
  ref::fill_random(q, seed);
  ref::fill_random(k, seed + 1);
  ref::fill_random_indices(pos, seed + 2, 0, c.max_positions - 1);
  const ref::Buffer q0 = q, k0 = k;

  std::vector<std::int64_t> token_shape =
      c.batch == 0 ? std::vector<std::int64_t>{c.seq} : std::vector<std::int64_t>{c.batch, c.seq};
  auto with = [&](std::vector<std::int64_t> s, std::int64_t h) {
    s.push_back(h);
    s.push_back(d);
    return s;
  };
  // positions [3, tokens...]: stream-major, or token-major storage viewed through strides.
  std::vector<std::int64_t> pos_shape = {3};
  pos_shape.insert(pos_shape.end(), token_shape.begin(), token_shape.end());
  embrope::Tensor pos_view = ref::view(pos, 0, pos_shape);
  if (c.positions_token_major) {
    std::vector<std::int64_t> strides = {1};
    for (std::size_t a = 1; a < pos_shape.size(); ++a) strides.push_back(0);
    std::int64_t s = 3;
    for (std::size_t a = pos_shape.size() - 1; a >= 1; --a) {
      strides[a] = s;
      s *= pos_shape[a];
    }
    pos_view = ref::view(pos, 0, pos_shape, strides);
  }
  auto position = [&](std::int64_t t, int stream) {
    return c.positions_token_major ? pos.get_index(t * 3 + stream)
                                   : pos.get_index(stream * tokens + t);
  };

  const RopeCache cache(RopeConfig{c.rotary_dim, 10000.0, c.max_positions});
  RopeOptions opt;
  opt.layout = c.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  opt.mrope_section = c.section;
  opt.mrope_interleaved = c.streams_interleaved;
  embrope::apply_rope(ref::view(q, 0, with(token_shape, c.hq)),
                      ref::view(k, 0, with(token_shape, c.hk)), pos_view, cache, opt);

  ref::Mismatches m;
  for (const bool is_q : {true, false}) {
    const std::int64_t heads = is_q ? c.hq : c.hk;
    const ref::Buffer& in = is_q ? q0 : k0;
    const ref::Buffer& out = is_q ? q : k;
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<double> cv(static_cast<std::size_t>(c.rotary_dim / 2)), sv(cv.size());
      const std::vector<int> interleaved = interleaved_streams(c.section, c.rotary_dim / 2);
      for (std::int64_t i = 0; i < c.rotary_dim / 2; ++i) {
        const int stream = c.streams_interleaved ? interleaved[static_cast<std::size_t>(i)]
                                                 : stream_of(c.section, i);
        const std::int64_t p = position(t, stream);
        const double angle = static_cast<double>(p) * ref::rope_inv_freq(i, c.rotary_dim, 10000.0);
        cv[static_cast<std::size_t>(i)] = std::cos(angle);
        sv[static_cast<std::size_t>(i)] = std::sin(angle);
      }
      ref::expect_rotated_token(m, is_q ? "q" : "k", in, out, t, heads, d, c.rotary_dim,
                                c.interleaved, false, cv, sv, c.dtype);
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

}  // namespace

TEST_CASE("mrope takes each frequency's angle from its section's position stream",
          "[rope][mrope]") {
  MropeCase c;
  c.dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  c.interleaved = GENERATE(false, true);
  INFO("dtype " << static_cast<int>(c.dtype) << (c.interleaved ? " interleaved" : " neox"));
  SECTION("Qwen2-VL sections [16, 24, 24], [T] tokens") {
    run_mrope(c);
  }
  SECTION("[B, S] tokens with int32 positions stored token-major") {
    c.batch = 2;
    c.seq = 5;
    c.pos_dtype = DType::int32;
    c.positions_token_major = true;
    run_mrope(c);
  }
  SECTION("partial rotary (R 64 of D 128) and an empty first section") {
    c.rotary_dim = 64;
    c.section = {0, 16, 16};
    run_mrope(c);
  }
  SECTION("one section takes everything") {
    c.section = {0, 0, 64};
    run_mrope(c);
  }
}

TEST_CASE("interleaved mrope (Qwen3-VL) takes frequency i's angle by HF's interleaving rule",
          "[rope][mrope][interleaved_streams]") {
  MropeCase c;
  c.streams_interleaved = true;
  c.dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  c.interleaved = GENERATE(false, true);
  INFO("dtype " << static_cast<int>(c.dtype) << (c.interleaved ? " interleaved" : " neox"));
  SECTION("Qwen3-VL sections [24, 20, 20], [T] tokens") {
    c.section = {24, 20, 20};
    run_mrope(c);
  }
  SECTION("[B, S] tokens, int32 positions token-major, partial rotary R 64 of D 128") {
    c.batch = 2;
    c.seq = 5;
    c.pos_dtype = DType::int32;
    c.positions_token_major = true;
    c.rotary_dim = 64;
    c.section = {12, 10, 10};
    run_mrope(c);
  }
  SECTION("only height interleaved") {
    c.section = {44, 20, 0};
    run_mrope(c);
  }
  SECTION("the largest sections that fit R / 2 = 64: height i = 1 .. 61, width i = 2 .. 62") {
    c.section = {22, 21, 21};
    run_mrope(c);
  }
}

TEST_CASE("mrope_interleaved: sections that do not fit and the flag without sections fail",
          "[rope][mrope][interleaved_streams][errors]") {
  ref::Buffer q(DType::float32, 4 * 128), pos(DType::int64, 3 * 4);
  const RopeCache cache(RopeConfig{128, 10000.0, 64});
  RopeOptions opt;
  opt.mrope_interleaved = true;
  opt.mrope_section = {0, 22, 42};
  // 3 * 22 - 2 = 64 is not below R / 2 = 64: height would take 21 frequencies, not 22.
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {4, 1, 128}), std::nullopt, ref::view(pos, 0, {3, 4}),
                            cache, opt);
      },
      {ErrorCode::invalid_argument},
      {"apply_rope", "interleaved mrope_section [0, 22, 42]", "rotary_dim / 2 = 64"});
  opt.mrope_section = {};
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {4, 1, 128}), std::nullopt, ref::view(pos, 0, {4}),
                            cache, opt);
      },
      {ErrorCode::invalid_argument}, {"apply_rope", "mrope_interleaved", "mrope_section"});
}

TEST_CASE("mrope with three equal streams is plain RoPE, bit for bit", "[rope][mrope][property]") {
  const std::int64_t t = 6, h = 3, d = 128;
  const RopeCache cache(RopeConfig{d, 1000000.0, 512});
  ref::Buffer q(DType::bfloat16, t * h * d), pos(DType::int64, t), pos3(DType::int64, 3 * t);
  ref::fill_random(q, 77);
  ref::fill_random_indices(pos, 78, 0, 511);
  for (std::int64_t j = 0; j < 3; ++j) {
    for (std::int64_t i = 0; i < t; ++i) pos3.set_index(j * t + i, pos.get_index(i));
  }
  ref::Buffer plain = q;
  embrope::apply_rope(ref::view(plain, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}), cache);
  RopeOptions opt;
  opt.mrope_section = {16, 24, 24};
  embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos3, 0, {3, t}), cache,
                      opt);
  CHECK(q.snapshot() == plain.snapshot());
}

TEST_CASE("mrope: a bad position in any stream zero-fills the token and is reported",
          "[rope][mrope][errors]") {
  const std::int64_t t = 4, h = 2, d = 64;
  const RopeCache cache(RopeConfig{d, 10000.0, 100});
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, 3 * t);
  ref::fill_random(q, 81);
  ref::fill_random_indices(pos, 82, 0, 99);
  pos.set_index(2 * t + 2, 100);  // stream 2 (width) of token 2
  const ref::Buffer q0 = q;
  RopeOptions opt;
  opt.mrope_section = {8, 12, 12};
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                            cache, opt);
      },
      {ErrorCode::index_out_of_range}, {"apply_rope", "100"});
  for (std::int64_t e = 0; e < h * d; ++e) CHECK(q.get(2 * h * d + e) == 0.0);
  // The other tokens were rotated (changed), not skipped.
  bool changed = false;
  for (std::int64_t e = 0; e < h * d; ++e) changed = changed || q.get(e) != q0.get(e);
  CHECK(changed);

  DeferredStatus status;
  opt.deferred = &status;
  embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}), cache,
                      opt);
  expect_error([&] { status.check(); }, {ErrorCode::index_out_of_range}, {"apply_rope", "100"});
}

TEST_CASE("mrope rejects sections and position shapes that do not fit", "[rope][mrope][errors]") {
  const std::int64_t t = 4, h = 2, d = 64;
  const RopeCache cache(RopeConfig{d, 10000.0, 100});
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, 3 * t);
  ref::fill_random(q, 91);
  ref::fill_random_indices(pos, 92, 0, 99);
  RopeOptions opt;
  opt.mrope_section = {8, 12, 11};
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                            cache, opt);
      },
      {ErrorCode::invalid_argument}, {"apply_rope", "mrope_section", "rotary_dim / 2 = 32"});
  opt.mrope_section = {-4, 20, 16};
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                            cache, opt);
      },
      {ErrorCode::invalid_argument}, {"apply_rope", "mrope_section", "non-negative"});
  // Sections whose sum wraps to R / 2 (2 * INT64_MAX + 34 = 32 modulo 2^64) were taken, and the
  // widened cos/sin row written far past its end.
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  opt.mrope_section = {huge, huge, 34};
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                            cache, opt);
      },
      {ErrorCode::invalid_argument}, {"apply_rope", "mrope_section", "rotary_dim / 2 = 32"});
  opt.mrope_section = {8, 12, 12};
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}), cache,
                            opt);
      },
      {ErrorCode::invalid_argument}, {"apply_rope", "positions"});
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {2, t}),
                            cache, opt);
      },
      {ErrorCode::invalid_argument}, {"apply_rope", "positions", "3"});
}
