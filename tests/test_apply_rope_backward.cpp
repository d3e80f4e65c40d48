// apply_rope_backward (docs/ops.md): the gradient of apply_rope with respect to q and
// k. Checked three independent ways: a central finite difference of the library's own
// forward (d/dx of sum(w * rope(x)) must equal rope_backward(w), for every element);
// against the float64 reference of the transposed rotation m R(-theta) with an attention
// factor m folded into caller tables; and properties (backward after forward is the
// identity for m = 1; the backward of an inverse forward is the forward rotation).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DType;
using embrope::Error;
using embrope::ErrorCode;
using embrope::RopeCache;
using embrope::RopeConfig;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::Tensor;

constexpr double kBase = 10000.0;
constexpr std::int64_t kMaxPositions = 200;

// cos and sin tables [P, R/2] in float32 with the attention factor m folded in, computed in
// float64 and rounded once; the float64 values are kept for the reference.
struct Tables {
  std::int64_t rotary_dim;
  double m;
  ref::Buffer cos, sin;
  Tables(std::int64_t r, double factor)
      : rotary_dim(r),
        m(factor),
        cos(DType::float32, kMaxPositions * r / 2),
        sin(DType::float32, kMaxPositions * r / 2) {
    for (std::int64_t p = 0; p < kMaxPositions; ++p) {
      for (std::int64_t i = 0; i < r / 2; ++i) {
        const double angle = static_cast<double>(p) * ref::rope_inv_freq(i, r, kBase);
        cos.set(p * r / 2 + i, m * std::cos(angle));
        sin.set(p * r / 2 + i, m * std::sin(angle));
      }
    }
  }
  Tensor cos_t() { return ref::view(cos, 0, {kMaxPositions, rotary_dim / 2}); }
  Tensor sin_t() { return ref::view(sin, 0, {kMaxPositions, rotary_dim / 2}); }
  // The float64 rotation of one head vector at position p (inverse: by -theta).
  std::vector<double> rotate(const std::vector<double>& x, std::int64_t p, bool interleaved,
                             bool inverse, std::vector<double>* magnitude = nullptr) const {
    std::vector<double> c, s;
    ref::rope_cos_sin(p, rotary_dim, kBase, c, s);
    for (auto& v : c) v *= m;
    for (auto& v : s) v *= m;
    return ref::rope_rotate(x, rotary_dim, interleaved, inverse, c, s, magnitude);
  }
};

std::vector<double> head(const ref::Buffer& b, std::int64_t row, std::int64_t dim) {
  std::vector<double> v(static_cast<std::size_t>(dim));
  for (std::int64_t e = 0; e < dim; ++e) v[static_cast<std::size_t>(e)] = b.get(row * dim + e);
  return v;
}

}  // namespace

TEST_CASE("apply_rope_backward is the gradient of apply_rope (central finite differences)",
          "[rope_backward]") {
  const std::int64_t t = 3, hq = 2, hk = 1, d = 16;
  for (bool interleaved : {false, true}) {
    for (std::int64_t r : {16, 12}) {
      for (double m : {1.0, 0.7}) {
        INFO("interleaved " << interleaved << " R " << r << " m " << m);
        Tables tables(r, m);
        ref::Buffer q(DType::float32, t * hq * d), k(DType::float32, t * hk * d);
        ref::Buffer wq(DType::float32, q.size()), wk(DType::float32, k.size());
        ref::Buffer yq(DType::float32, q.size()), yk(DType::float32, k.size());
        ref::Buffer pos(DType::int64, t);
        ref::fill_random(q, ref::seed_of({r, 1}));
        ref::fill_random(k, ref::seed_of({r, 2}));
        ref::fill_random(wq, ref::seed_of({r, 3}));
        ref::fill_random(wk, ref::seed_of({r, 4}));
        ref::fill_random_indices(pos, ref::seed_of({r, 5}), 0, kMaxPositions - 1);
        RopeOptions fwd;
        fwd.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
        fwd.q_out = ref::view(yq, 0, {t, hq, d});
        fwd.k_out = ref::view(yk, 0, {t, hk, d});
        // f(q, k) = sum(wq * rope(q)) + sum(wk * rope(k)), in float64 over float32 outputs.
        auto f = [&] {
          embrope::apply_rope(ref::view(q, 0, {t, hq, d}), ref::view(k, 0, {t, hk, d}),
                              ref::view(pos, 0, {t}), tables.cos_t(), tables.sin_t(), fwd);
          double s = 0.0;
          for (std::int64_t i = 0; i < yq.size(); ++i) s += wq.get(i) * yq.get(i);
          for (std::int64_t i = 0; i < yk.size(); ++i) s += wk.get(i) * yk.get(i);
          return s;
        };
        // The gradient: rope_backward(w), in place on copies of w.
        ref::Buffer dq = wq, dk = wk;
        RopeOptions bwd;
        bwd.layout = fwd.layout;
        embrope::apply_rope_backward(ref::view(dq, 0, {t, hq, d}), ref::view(dk, 0, {t, hk, d}),
                                     ref::view(pos, 0, {t}), tables.cos_t(), tables.sin_t(), bwd);
        ref::Mismatches mm;
        for (ref::Buffer* x : {&q, &k}) {
          const ref::Buffer& grad = x == &q ? dq : dk;
          const ref::Buffer& w = x == &q ? wq : wk;
          for (std::int64_t i = 0; i < x->size(); ++i) {
            const double x0 = x->get(i);
            x->set(i, x0 + 0.5);
            const double plus_x = x->get(i);
            const double plus = f();
            x->set(i, x0 - 0.5);
            const double minus_x = x->get(i);
            const double minus = f();
            x->set(i, x0);
            const double fd = (plus - minus) / (plus_x - minus_x);
            // f is linear: only the float32 rounding of the two changed outputs remains.
            const double w_norm = ref::norm(head(w, i / d, d));
            mm.expect_close(
                [&] {
                  return ref::where(x == &q ? "dq" : "dk", {i / d, i % d});
                },
                grad.get(i), fd, 1e-5 * w_norm);
          }
        }
        INFO(mm.summary());
        CHECK(mm.count == 0);
        CHECK(mm.checked == q.size() + k.size());
      }
    }
  }
}

TEST_CASE("apply_rope_backward equals the float64 transposed rotation m R(-theta)",
          "[rope_backward]") {
  const std::int64_t t = 7, hq = 4, hk = 2, d = 32;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (bool interleaved : {false, true}) {
      for (std::int64_t r : {32, 20}) {
        for (bool forward_inverse : {false, true}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " interleaved " << interleaved << " R "
                        << r << " forward inverse " << forward_inverse);
          Tables tables(r, 0.8);
          ref::Buffer dq(dtype, t * hq * d), dk(dtype, t * hk * d), pos(DType::int32, t);
          ref::fill_random(dq, ref::seed_of({r, 11, static_cast<int>(dtype)}));
          ref::fill_random(dk, ref::seed_of({r, 12, static_cast<int>(dtype)}));
          ref::fill_random_indices(pos, ref::seed_of({r, 13}), 0, kMaxPositions - 1);
          const ref::Buffer q0 = dq, k0 = dk;
          RopeOptions o;
          o.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
          o.inverse = forward_inverse;
          embrope::apply_rope_backward(ref::view(dq, 0, {t, hq, d}), ref::view(dk, 0, {t, hk, d}),
                                       ref::view(pos, 0, {t}), tables.cos_t(), tables.sin_t(), o);
          ref::Mismatches mm;
          for (const auto& [got, in, heads] :
               {std::make_tuple(&dq, &q0, hq), std::make_tuple(&dk, &k0, hk)}) {
            for (std::int64_t row = 0; row < t * heads; ++row) {
              std::vector<double> mag;
              // The gradient of a forward by +theta is a rotation by -theta, and vice versa.
              const std::vector<double> want =
                  tables.rotate(head(*in, row, d), pos.get_index(row / heads), interleaved,
                                !forward_inverse, &mag);
              const double norm = ref::norm(want);
              for (std::int64_t e = 0; e < d; ++e) {
                const auto ue = static_cast<std::size_t>(e);
                mm.expect_close(
                    [&] {
                      return ref::where("grad", {row, e});
                    },
                    got->get(row * d + e), want[ue],
                    ref::tolerance(dtype, want[ue], norm, mag[ue]));
              }
            }
          }
          INFO(mm.summary());
          CHECK(mm.count == 0);
        }
      }
    }
  }
}

TEST_CASE("apply_rope_backward after apply_rope is the identity (a rotation is orthogonal)",
          "[rope_backward]") {
  const std::int64_t b = 2, s = 5, h = 3, d = 64;
  RopeCache cache(RopeConfig{48, kBase, kMaxPositions});
  ref::Buffer q(DType::float32, b * s * h * d), pos(DType::int64, b * s);
  ref::fill_random(q, 21);
  ref::fill_random_indices(pos, 22, 0, kMaxPositions - 1);
  const ref::Buffer q0 = q;
  const Tensor tq = ref::view(q, 0, {b, s, h, d});
  const Tensor tp = ref::view(pos, 0, {b, s});
  embrope::apply_rope(tq, std::nullopt, tp, cache);
  embrope::apply_rope_backward(tq, std::nullopt, tp, cache);
  ref::Mismatches mm;
  for (std::int64_t row = 0; row < b * s * h; ++row) {
    const std::vector<double> x = head(q0, row, d);
    const double norm = ref::norm(x);
    for (std::int64_t e = 0; e < d; ++e) {
      mm.expect_close(
          [&] {
            return ref::where("q", {row, e});
          },
          q.get(row * d + e), x[static_cast<std::size_t>(e)], 2 * ref::kFloat32RelTol * norm);
    }
  }
  INFO(mm.summary());
  CHECK(mm.count == 0);
}

TEST_CASE("apply_rope_backward out of place leaves dq and dk and copies the pass-through part",
          "[rope_backward]") {
  const std::int64_t t = 4, h = 2, d = 24, r = 16;
  RopeCache cache(RopeConfig{r, kBase, kMaxPositions});
  ref::Buffer dq(DType::bfloat16, t * h * d), out(DType::bfloat16, t * h * d), pos(DType::int64, t);
  ref::fill_random(dq, 31);
  ref::poison(out);
  ref::fill_random_indices(pos, 32, 0, kMaxPositions - 1);
  const auto before = dq.snapshot();
  RopeOptions o;
  o.q_out = ref::view(out, 0, {t, h, d});
  embrope::apply_rope_backward(ref::view(dq, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}),
                               cache, o);
  CHECK(dq.snapshot() == before);
  ref::Mismatches mm;
  for (std::int64_t row = 0; row < t * h; ++row) {
    std::vector<double> mag;
    const std::vector<double> want =
        ref::rope(head(dq, row, d), pos.get_index(row / h), r, kBase, false, true, &mag);
    for (std::int64_t e = 0; e < d; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      if (e >= r) {
        mm.expect_bits(
            [&] {
              return ref::where("out", {row, e});
            },
            out.bits(row * d + e), dq.bits(row * d + e));
      } else {
        mm.expect_close(
            [&] {
              return ref::where("out", {row, e});
            },
            out.get(row * d + e), want[ue],
            ref::tolerance(DType::bfloat16, want[ue], 0.0, mag[ue]));
      }
    }
  }
  INFO(mm.summary());
  CHECK(mm.count == 0);
}

TEST_CASE("apply_rope_backward errors name apply_rope_backward", "[rope_backward][errors]") {
  const std::int64_t t = 4, h = 2, d = 16;
  ref::Buffer dq(DType::float32, t * h * d), pos(DType::int64, t);
  ref::fill_random(dq, 41);
  SECTION("rotary_dim past head_dim") {
    RopeCache cache(RopeConfig{32, kBase, kMaxPositions});
    ref::fill_random_indices(pos, 42, 0, 10);
    expect_error(
        [&] {
          embrope::apply_rope_backward(ref::view(dq, 0, {t, h, d}), std::nullopt,
                                       ref::view(pos, 0, {t}), cache);
        },
        {ErrorCode::invalid_argument}, {"apply_rope_backward", "rotary_dim", "32", "16"});
  }
  SECTION("a position outside the cache zero-fills its rows and is reported") {
    RopeCache cache(RopeConfig{16, kBase, 8});
    pos.set_index(0, 1);
    pos.set_index(1, 2);
    pos.set_index(2, 9);
    pos.set_index(3, 3);
    expect_error(
        [&] {
          embrope::apply_rope_backward(ref::view(dq, 0, {t, h, d}), std::nullopt,
                                       ref::view(pos, 0, {t}), cache);
        },
        {ErrorCode::index_out_of_range}, {"apply_rope_backward", "positions[2]", "9"});
    for (std::int64_t e = 0; e < h * d; ++e) CHECK(dq.get(2 * h * d + e) == 0.0);
  }
  SECTION("a bad position recorded in a DeferredStatus is reported as the backward's") {
    RopeCache cache(RopeConfig{16, kBase, 8});
    pos.set_index(0, 1);
    pos.set_index(1, -4);
    pos.set_index(2, 2);
    pos.set_index(3, 3);
    embrope::DeferredStatus status;
    RopeOptions o;
    o.deferred = &status;
    embrope::apply_rope_backward(ref::view(dq, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}),
                                 cache, o);
    CHECK_FALSE(status.ok());
    expect_error([&] { status.check(); }, {ErrorCode::index_out_of_range},
                 {"apply_rope_backward", "positions[1]", "-4"});
    for (std::int64_t e = 0; e < h * d; ++e) CHECK(dq.get(1 * h * d + e) == 0.0);
  }
  SECTION("dk_out without dk") {
    RopeCache cache(RopeConfig{16, kBase, 8});
    ref::fill_random_indices(pos, 43, 0, 7);
    ref::Buffer out(DType::float32, t * h * d);
    RopeOptions o;
    o.k_out = ref::view(out, 0, {t, h, d});
    expect_error(
        [&] {
          embrope::apply_rope_backward(ref::view(dq, 0, {t, h, d}), std::nullopt,
                                       ref::view(pos, 0, {t}), cache, o);
        },
        {ErrorCode::invalid_argument}, {"apply_rope_backward", "dk_out", "dk"});
  }
}
