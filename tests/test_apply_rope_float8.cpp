// apply_rope with float8 outputs (RoPE + quantization, docs/ops.md "Float8 outputs") against
// the float64 reference rotation, scaled and rounded by the tests' own float8 encoder
// (reference.hpp): every value dtype, both float8 formats and both layouts, partial rotary
// (the pass-through part is scaled too), GQA, per-head scales, saturation, NaN and bad
// positions; then the argument rules.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

using embrope::DType;
using embrope::ErrorCode;
using embrope::RopeCache;
using embrope::RopeConfig;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::Tensor;

namespace {

constexpr std::initializer_list<ErrorCode> kInvalid = {ErrorCode::invalid_argument};

struct Float8Case {
  DType dtype, out;
  bool interleaved;
  std::int64_t head_dim, rotary_dim;
  bool head_scales;
};

// The float8 code a float32 computation of `want` may give: the rounding of want, or of a
// value within the float32 arithmetic's error `slack` of it (a rounding boundary in between).
bool acceptable(DType out, std::uint8_t code, double want, double slack) {
  return code == ref::encode_fp8(out, want) || code == ref::encode_fp8(out, want - slack) ||
         code == ref::encode_fp8(out, want + slack);
}

void run_case(const Float8Case& c) {
  INFO("dtype " << embrope::dtype_name(c.dtype) << " -> " << embrope::dtype_name(c.out)
                << (c.interleaved ? ", interleaved" : ", neox") << ", head_dim " << c.head_dim
                << ", rotary_dim " << c.rotary_dim << (c.head_scales ? ", head scales" : ""));
  const std::int64_t t = 5, hq = 4, hk = 2, d = c.head_dim, r = c.rotary_dim, n = 64;
  const double base = 10000.0;
  ref::Buffer q(c.dtype, t * hq * d), k(c.dtype, t * hk * d), pos(DType::int64, t);
  ref::Buffer q_out(c.out, t * hq * d), k_out(c.out, t * hk * d);
  ref::Buffer scales(DType::float32, hq), k_scales(DType::float32, hk);
  ref::fill_random(q, 11);
  ref::fill_random(k, 12);
  ref::fill_random_indices(pos, 13, 0, n - 1);
  for (std::int64_t i = 0; i < t * hq * d; i += 7) q.set(i, q.get(i) * 300.0);  // saturates
  q.set(3, std::numeric_limits<double>::quiet_NaN());
  const float head[hq] = {0.5f, 1.0f, 3.0f, 0.125f};
  const float k_head[hk] = {2.0f, 0.5f};  // [Hk], not [Hq]: GQA
  for (std::int64_t h = 0; h < hq; ++h) scales.set(h, head[h]);
  for (std::int64_t h = 0; h < hk; ++h) k_scales.set(h, k_head[h]);
  RopeCache cache(RopeConfig{r, base, n});
  RopeOptions o;
  o.layout = c.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  o.q_out = ref::view(q_out, 0, {t, hq, d});
  o.k_out = ref::view(k_out, 0, {t, hk, d});
  o.q_out_scale = 4.0f;
  o.k_out_scale = 0.75f;
  if (c.head_scales) {
    o.q_out_head_scales = ref::view(scales, 0, {hq});
    o.k_out_head_scales = ref::view(k_scales, 0, {hk});
  }
  embrope::apply_rope(ref::view(q, 0, {t, hq, d}), ref::view(k, 0, {t, hk, d}),
                      ref::view(pos, 0, {t}), cache, o);

  std::int64_t checked = 0;
  const auto check_heads = [&](ref::Buffer& in, ref::Buffer& out, std::int64_t heads, bool is_q) {
    for (std::int64_t tok = 0; tok < t; ++tok) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t row = (tok * heads + h) * d;
        std::vector<double> x(static_cast<std::size_t>(d));
        for (std::int64_t j = 0; j < d; ++j) x[static_cast<std::size_t>(j)] = in.get(row + j);
        std::vector<double> magnitude;
        const std::vector<double> y =
            ref::rope(x, pos.get_index(tok), r, base, c.interleaved, false, &magnitude);
        // The scale as the library forms it: the per-tensor scale times the head's, in float32.
        const float head_scale = !c.head_scales ? 1.0f : is_q ? head[h] : k_head[h];
        const double scale = static_cast<double>((is_q ? 4.0f : 0.75f) * head_scale);
        for (std::int64_t j = 0; j < d; ++j) {
          const auto u = static_cast<std::size_t>(j);
          const auto code = static_cast<std::uint8_t>(out.bits(row + j));
          if (std::isnan(y[u])) {
            CHECK(ref::fp8_is_nan(c.out, code));
            continue;
          }
          // float32 rotation error (table and arithmetic) is a few ulps of the terms' size.
          const double slack = 8.0 * 6e-8 * magnitude[u] * scale;
          INFO("token " << tok << (is_q ? " q" : " k") << " head " << h << " element " << j
                        << ": want " << y[u] * scale << ", got code " << int(code) << " = "
                        << ref::decode_fp8(c.out, code));
          CHECK(acceptable(c.out, code, y[u] * scale, slack));
          ++checked;
        }
      }
    }
  };
  check_heads(q, q_out, hq, true);
  check_heads(k, k_out, hk, false);
  CHECK(checked > 0);
}

}  // namespace

TEST_CASE("apply_rope float8 outputs equal the float64 rotation times the scale, rounded once",
          "[rope][float8]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType out : {DType::float8_e4m3fn, DType::float8_e5m2}) {
      for (bool interleaved : {false, true}) {
        run_case({dtype, out, interleaved, 64, 64, false});
        run_case({dtype, out, interleaved, 96, 32, true});
      }
    }
  }
}

TEST_CASE("apply_rope float8 outputs: a bad position zero-fills its rows and is reported",
          "[rope][float8]") {
  const std::int64_t t = 3, h = 2, d = 64;
  ref::Buffer q(DType::bfloat16, t * h * d), pos(DType::int64, t);
  ref::Buffer q_out(DType::float8_e4m3fn, t * h * d);
  ref::fill_random(q, 1);
  pos.set_index(0, 1);
  pos.set_index(1, 99);  // outside the table of 16 rows
  pos.set_index(2, 2);
  ref::poison(q_out);
  RopeCache cache(RopeConfig{d, 10000.0, 16});
  RopeOptions o;
  o.q_out = ref::view(q_out, 0, {t, h, d});
  o.q_out_scale = 2.0f;
  expect_error(
      [&] {
        embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}), cache,
                            o);
      },
      {ErrorCode::index_out_of_range}, {"apply_rope", "positions", "99"});
  for (std::int64_t i = 0; i < h * d; ++i) {
    CHECK(q_out.bits(h * d + i) == 0);         // token 1: zero-filled
    CHECK(q_out.bits(i) != 0x7f);              // token 0: written
    CHECK(q_out.bits(2 * h * d + i) != 0x7f);  // token 2: written
  }
}

TEST_CASE("apply_rope float8 outputs: argument rules", "[rope][float8][errors]") {
  const std::int64_t t = 3, hq = 2, hk = 1, d = 64;
  ref::Buffer q(DType::bfloat16, t * hq * d), k(DType::bfloat16, t * hk * d);
  ref::Buffer pos(DType::int64, t), scales(DType::float32, hq), scales16(DType::float16, hq);
  ref::Buffer q8(DType::float8_e4m3fn, t * hq * d), k8(DType::float8_e4m3fn, t * hk * d);
  ref::Buffer k5(DType::float8_e5m2, t * hk * d), q16(DType::bfloat16, t * hq * d);
  ref::fill_random(q, 1);
  ref::fill_random(k, 2);
  ref::fill_random_indices(pos, 3, 0, 7);
  RopeCache cache(RopeConfig{d, 10000.0, 8});
  const Tensor qt = ref::view(q, 0, {t, hq, d}), kt = ref::view(k, 0, {t, hk, d});
  const Tensor pt = ref::view(pos, 0, {t});
  RopeOptions o;
  o.q_out = ref::view(q8, 0, {t, hq, d});
  o.k_out = ref::view(k8, 0, {t, hk, d});
  CHECK_NOTHROW(embrope::apply_rope(qt, kt, pt, cache, o));  // the valid call

  SECTION("k without k_out") {
    o.k_out.reset();
    const auto k_before = k.snapshot();
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "k_out", "float8_e4m3fn", "quantized"});
    CHECK(k.snapshot() == k_before);
  }
  SECTION("float8 outputs of two formats") {
    o.k_out = ref::view(k5, 0, {t, hk, d});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "k_out", "float8_e5m2", "one dtype"});
  }
  SECTION("a float8 k_out beside a bfloat16 q_out") {
    o.q_out = ref::view(q16, 0, {t, hq, d});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "k_out", "both or neither"});
  }
  SECTION("scales that are not positive and finite") {
    for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      o.q_out_scale = bad;
      expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                   {"apply_rope", "q_out_scale", "positive and finite"});
    }
    o.q_out_scale = 1.0f;
    o.k_out_scale = 0.0f;
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "k_out_scale"});
  }
  SECTION("a scale for an output that is not float8") {
    RopeOptions plain;
    plain.q_out_scale = 2.0f;
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, plain); }, kInvalid,
                 {"apply_rope", "q_out_scale", "float8 outputs only", "bfloat16"});
    plain.q_out_scale = 1.0f;
    plain.k_out_head_scales = ref::view(scales, 0, {hk});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, plain); }, kInvalid,
                 {"apply_rope", "k_out_head_scales", "float8 outputs only"});
    plain.k_out_head_scales.reset();
    plain.k_out_scale = 3.0f;
    expect_error([&] { embrope::apply_rope(qt, std::nullopt, pt, cache, plain); }, kInvalid,
                 {"apply_rope", "k_out_scale", "k is not given"});
  }
  SECTION("head scales of the wrong shape or dtype") {
    o.q_out_head_scales = ref::view(scales, 0, {1});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "q_out_head_scales"});
    o.q_out_head_scales = ref::view(scales16, 0, {hq});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "q_out_head_scales", "float32"});
    o.q_out_head_scales = ref::view(scales, 0, {1, hq});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "q_out_head_scales"});
  }
  SECTION("head scales inside an output") {
    // The float32 head scales are the first 8 bytes of q_out.
    o.q_out_head_scales = Tensor(q8.at(0), DType::float32, {hq});
    expect_error([&] { embrope::apply_rope(qt, kt, pt, cache, o); }, kInvalid,
                 {"apply_rope", "q_out", "q_out_head_scales"});
  }
  SECTION("float8 outputs of the other RoPE ops") {
    RopeOptions back;
    back.q_out = ref::view(q8, 0, {t, hq, d});
    back.k_out = ref::view(k8, 0, {t, hk, d});
    expect_error([&] { embrope::apply_rope_backward(qt, kt, pt, cache, back); }, kInvalid,
                 {"apply_rope_backward", "dq_out", "float8 outputs are apply_rope's"});
    expect_error([&] { embrope::apply_qk_norm_rope(qt, kt, pt, cache, {}, back); }, kInvalid,
                 {"apply_qk_norm_rope", "q_out", "float8"});
    ref::Buffer v(DType::bfloat16, t * hk * d), k_cache(DType::bfloat16, 4 * 4 * hk * d);
    ref::Buffer v_cache(DType::bfloat16, 4 * 4 * hk * d), slots(DType::int64, t);
    ref::fill_random_indices(slots, 4, 0, 15);
    embrope::KvCache kv;
    kv.k = ref::view(k_cache, 0, {4, 4, hk, d});
    kv.v = ref::view(v_cache, 0, {4, 4, hk, d});
    const auto cache_before = k_cache.snapshot();
    expect_error(
        [&] {
          embrope::apply_rope_append_kv(qt, kt, ref::view(v, 0, {t, hk, d}), pt, cache, kv,
                                        embrope::KvSlots::paged(ref::view(slots, 0, {t})), back);
        },
        kInvalid, {"apply_rope_append_kv", "k_out", "float8 k_cache with k_scale"});
    CHECK(k_cache.snapshot() == cache_before);
    RopeOptions scaled;
    scaled.q_out_scale = 2.0f;
    expect_error([&] { embrope::apply_rope_backward(qt, kt, pt, cache, scaled); }, kInvalid,
                 {"apply_rope_backward", "q_out_scale", "apply_rope's"});
  }
}

// The non-rotary parts held apart (RopeOptions::q_nope / k_nope; FlashInfer's
// rope_quantize_fp8 and mla_rope_quantize_fp8): DeepSeek MLA's q [T, H, 128 | 64] as q_nope
// and q's rope slice (views of one tensor), k_pe [T, 1, 64] with kv_c [T, 1, 512] as k_nope,
// and a GQA case with per-head scales. Each non-rotary element is float8(value * its head's
// scale), rounded once (the tests' own encoder); the rotated parts as above.
TEST_CASE("apply_rope float8 outputs with non-rotary tensors (MLA, GQA): quantized alike",
          "[rope][float8]") {
  struct NopeCase {
    DType dtype, out;
    std::int64_t hq, hk, rope, q_nope, k_nope;
    bool interleaved, head_scales;
  };
  for (const NopeCase& c :
       {NopeCase{DType::bfloat16, DType::float8_e4m3fn, 4, 1, 64, 128, 512, true, false},
        NopeCase{DType::float16, DType::float8_e5m2, 4, 2, 32, 24, 40, false, true},
        NopeCase{DType::float32, DType::float8_e4m3fn, 3, 1, 16, 6, 3, true, true}}) {
    INFO(embrope::dtype_name(c.dtype)
         << " -> " << embrope::dtype_name(c.out) << ", Hq " << c.hq << " Hk " << c.hk << ", rope "
         << c.rope << ", nope " << c.q_nope << " / " << c.k_nope);
    const std::int64_t t = 6, n = 64, qd = c.q_nope + c.rope, kd = c.k_nope + c.rope;
    // q [T, H, nope | rope] and kv_a [T, k_nope | rope], as the projections write them.
    ref::Buffer q(c.dtype, t * c.hq * qd), kv(c.dtype, t * c.hk * kd), pos(DType::int64, t);
    ref::Buffer q_out(c.out, t * c.hq * c.rope), k_out(c.out, t * c.hk * c.rope);
    ref::Buffer q_nope_out(c.out, t * c.hq * c.q_nope), k_nope_out(c.out, t * c.hk * c.k_nope);
    ref::Buffer scales(DType::float32, c.hq), k_scales(DType::float32, c.hk);
    ref::fill_random(q, 21);
    ref::fill_random(kv, 22);
    ref::fill_random_indices(pos, 23, 0, n - 1);
    for (std::int64_t i = 0; i < q.size(); i += 11) q.set(i, q.get(i) * 500.0);  // saturates
    for (ref::Buffer* b : {&q_out, &k_out, &q_nope_out, &k_nope_out}) ref::poison(*b);
    for (std::int64_t h = 0; h < c.hq; ++h) scales.set(h, 0.25 * static_cast<double>(h + 1));
    for (std::int64_t h = 0; h < c.hk; ++h) k_scales.set(h, 2.0 / static_cast<double>(h + 1));
    RopeCache cache(RopeConfig{c.rope, 10000.0, n});
    RopeOptions o;
    o.layout = c.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
    o.q_out = ref::view(q_out, 0, {t, c.hq, c.rope});
    o.k_out = ref::view(k_out, 0, {t, c.hk, c.rope});
    o.q_out_scale = 1.5f;
    o.k_out_scale = 0.5f;
    if (c.head_scales) {
      o.q_out_head_scales = ref::view(scales, 0, {c.hq});
      o.k_out_head_scales = ref::view(k_scales, 0, {c.hk});
    }
    o.q_nope = ref::view(q, 0, {t, c.hq, c.q_nope}, {c.hq * qd, qd, 1});
    o.q_nope_out = ref::view(q_nope_out, 0, {t, c.hq, c.q_nope});
    o.k_nope = ref::view(kv, 0, {t, c.hk, c.k_nope}, {c.hk * kd, kd, 1});
    o.k_nope_out = ref::view(k_nope_out, 0, {t, c.hk, c.k_nope});
    embrope::apply_rope(ref::view(q, c.q_nope, {t, c.hq, c.rope}, {c.hq * qd, qd, 1}),
                        ref::view(kv, c.k_nope, {t, c.hk, c.rope}, {c.hk * kd, kd, 1}),
                        ref::view(pos, 0, {t}), cache, o);
    std::int64_t checked = 0;
    for (int side = 0; side < 2; ++side) {
      const bool is_q = side == 0;
      const std::int64_t heads = is_q ? c.hq : c.hk, nope = is_q ? c.q_nope : c.k_nope;
      const std::int64_t row_len = is_q ? qd : kd;
      const ref::Buffer& in = is_q ? q : kv;
      const ref::Buffer& rot_out = is_q ? q_out : k_out;
      const ref::Buffer& nope_out = is_q ? q_nope_out : k_nope_out;
      for (std::int64_t tok = 0; tok < t; ++tok) {
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t row = (tok * heads + h) * row_len;
          const float head =
              !c.head_scales ? 1.0f : static_cast<float>(is_q ? scales.get(h) : k_scales.get(h));
          const double scale = static_cast<double>((is_q ? 1.5f : 0.5f) * head);
          for (std::int64_t j = 0; j < nope; ++j) {  // passed through, scaled, rounded once
            const auto code =
                static_cast<std::uint8_t>(nope_out.bits((tok * heads + h) * nope + j));
            INFO("token " << tok << (is_q ? " q" : " k") << "_nope head " << h << " element " << j);
            CHECK(code == ref::encode_fp8(c.out, static_cast<double>(
                                                     static_cast<float>(in.get(row + j) * scale))));
            ++checked;
          }
          std::vector<double> x(static_cast<std::size_t>(c.rope)), magnitude;
          for (std::int64_t j = 0; j < c.rope; ++j) {
            x[static_cast<std::size_t>(j)] = in.get(row + nope + j);
          }
          const std::vector<double> y =
              ref::rope(x, pos.get_index(tok), c.rope, 10000.0, c.interleaved, false, &magnitude);
          for (std::int64_t j = 0; j < c.rope; ++j) {
            const auto u = static_cast<std::size_t>(j);
            const auto code =
                static_cast<std::uint8_t>(rot_out.bits((tok * heads + h) * c.rope + j));
            INFO("token " << tok << (is_q ? " q" : " k") << " rope head " << h << " element " << j);
            CHECK(acceptable(c.out, code, y[u] * scale, 8.0 * 6e-8 * magnitude[u] * scale));
            ++checked;
          }
        }
      }
    }
    CHECK(checked > 0);
  }
}

TEST_CASE("apply_rope float8 non-rotary tensors: a bad position, and the argument rules",
          "[rope][float8][errors]") {
  const std::int64_t t = 3, h = 2, r = 16, nope = 8;
  ref::Buffer q(DType::bfloat16, t * h * r), qn(DType::bfloat16, t * h * nope),
      pos(DType::int64, t);
  ref::Buffer q_out(DType::float8_e4m3fn, t * h * r), qn_out(DType::float8_e4m3fn, t * h * nope);
  ref::fill_random(q, 31);
  ref::fill_random(qn, 32);
  for (std::int64_t i = 0; i < t; ++i) pos.set_index(i, i);
  pos.set_index(1, 99);  // past the table: token 1's rows are zero codes
  ref::poison(qn_out);
  RopeCache cache(RopeConfig{r, 10000.0, 16});
  RopeOptions o;
  o.q_out = ref::view(q_out, 0, {t, h, r});
  o.q_nope = ref::view(qn, 0, {t, h, nope});
  o.q_nope_out = ref::view(qn_out, 0, {t, h, nope});
  embrope::DeferredStatus status;
  o.deferred = &status;
  const Tensor qt = ref::view(q, 0, {t, h, r}), pt = ref::view(pos, 0, {t});
  embrope::apply_rope(qt, std::nullopt, pt, cache, o);
  CHECK_THROWS_AS(status.check(), embrope::Error);
  for (std::int64_t j = 0; j < h * nope; ++j) {
    CHECK(qn_out.bits(h * nope + j) == 0);                                      // token 1
    CHECK(qn_out.bits(j) == ref::encode_fp8(DType::float8_e4m3fn, qn.get(j)));  // token 0
  }
  o.deferred = nullptr;
  pos.set_index(1, 1);
  auto expect = [&](const RopeOptions& opts, std::initializer_list<const char*> parts) {
    expect_error([&] { embrope::apply_rope(qt, std::nullopt, pt, cache, opts); }, kInvalid, parts);
  };
  RopeOptions only = o;
  only.q_nope_out.reset();
  expect(only, {"apply_rope", "q_nope is given but q_nope_out is not"});
  RopeOptions unquantized = o;
  ref::Buffer q16(DType::bfloat16, t * h * r);
  unquantized.q_out = ref::view(q16, 0, {t, h, r});
  expect(unquantized, {"q_nope is for float8 outputs"});
  RopeOptions heads = o;
  heads.q_nope = ref::view(qn, 0, {t, 1, 2 * nope});
  expect(heads, {"q_nope", "the heads of its rotated part"});
  RopeOptions shape = o;
  shape.q_nope_out = ref::view(qn_out, 0, {t, h, nope / 2});
  expect(shape, {"q_nope_out has shape", "q_nope has"});
  RopeOptions dtype = o;
  ref::Buffer qn32(DType::float32, t * h * nope);
  dtype.q_nope = ref::view(qn32, 0, {t, h, nope});
  expect(dtype, {"q_nope has dtype float32"});
  RopeOptions overlap = o;
  overlap.q_nope_out = ref::view(q_out, 0, {t, h, nope});  // inside q_out
  expect(overlap, {"q_nope_out", "overlaps"});
  // Two outputs end to end in one buffer, in either order: sharing the one byte where they meet
  // is an overlap (validate.cpp's byte-range test, at its boundary); starting just past it is not.
  ref::Buffer joined(DType::float8_e4m3fn, t * h * (r + nope));
  for (bool q_out_first : {true, false}) {
    for (std::int64_t shift : {-1, 0}) {  // the second view's start against the first's end
      const std::int64_t first_dim = q_out_first ? r : nope, second_dim = q_out_first ? nope : r;
      const Tensor first = ref::view(joined, 0, {t, h, first_dim});
      const Tensor second = ref::view(joined, t * h * first_dim + shift, {t, h, second_dim});
      RopeOptions placed = o;
      placed.q_out = q_out_first ? first : second;
      placed.q_nope_out = q_out_first ? second : first;
      INFO("q_out first: " << q_out_first << ", shift " << shift);
      if (shift < 0) {
        expect(placed, {"q_nope_out", "overlaps", "q_out"});
      } else {
        CHECK_NOTHROW(embrope::apply_rope(qt, std::nullopt, pt, cache, placed));
      }
    }
  }
  RopeOptions no_k = o;
  no_k.k_nope = ref::view(qn, 0, {t, h, nope});
  no_k.k_nope_out = ref::view(qn_out, 0, {t, h, nope});
  expect(no_k, {"k_nope is given but k is not"});
  // The other RoPE ops refuse them.
  expect_error([&] { embrope::apply_rope_backward(qt, std::nullopt, pt, cache, o); }, kInvalid,
               {"apply_rope_backward"});
}
