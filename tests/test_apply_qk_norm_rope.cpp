// apply_qk_norm_rope and apply_qk_norm_rope_backward (docs/ops.md) on the CPU, against an
// independent float64 reference written from the formulas: per (token, head) row,
// n = x / sqrt(mean(x^2) + eps) * w (w or 1 + w), then the RoFormer rotation of n's pairs. The
// gradients are checked against central finite differences of that float64 forward and
// against the unfused composition's backward (the library's apply_rope_backward, then the
// float64 RMSNorm gradient from its formula).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DType;
using embrope::ErrorCode;
using embrope::QkNorm;
using embrope::QkNormGradients;
using embrope::RopeCache;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::Tensor;

constexpr double kBase = 10000.0;
constexpr std::int64_t kMaxPositions = 512;

struct Shape {
  std::int64_t tokens, hq, hk, dim, rotary;
};

// The float64 forward of one row: RMSNorm with weight factors wf, then RoPE at `position`.
// magnitude (optional) gets the size of the float32 terms per element.
std::vector<double> reference_row(const std::vector<double>& x, const std::vector<double>& wf,
                                  double eps, std::int64_t position, std::int64_t rotary,
                                  bool interleaved, bool inverse,
                                  std::vector<double>* magnitude = nullptr) {
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double rstd = 1.0 / std::sqrt(sum / static_cast<double>(x.size()) + eps);
  std::vector<double> n(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) n[j] = x[j] * rstd * wf[j];
  return ref::rope(n, position, rotary, kBase, interleaved, inverse, magnitude);
}

// Inputs of a call: q, k, positions, weights (weight dtype wdtype), and the float64 weight
// factors.
struct Inputs {
  Shape shape;
  DType dtype;
  ref::Buffer q, k, positions, q_weight, k_weight;
  bool unit_offset;
  Inputs(Shape s, DType d, DType wdtype, bool unit, std::uint64_t seed)
      : shape(s),
        dtype(d),
        q(d, s.tokens * s.hq * s.dim),
        k(d, s.tokens * s.hk * s.dim),
        positions(DType::int64, s.tokens),
        q_weight(wdtype, s.dim),
        k_weight(wdtype, s.dim),
        unit_offset(unit) {
    ref::fill_random(q, seed);
    ref::fill_random(k, seed + 1);
    ref::fill_random_indices(positions, seed + 2, 0, kMaxPositions - 1);
    ref::fill_random(q_weight, seed + 3);
    ref::fill_random(k_weight, seed + 4);
    // Weights around 1 (Qwen3's, stored) or around 0 (Gemma's, applied as 1 + w).
    if (!unit) {
      for (std::int64_t j = 0; j < s.dim; ++j) {
        q_weight.set(j, 1.0 + 0.5 * q_weight.get(j));
        k_weight.set(j, 1.0 + 0.5 * k_weight.get(j));
      }
    }
  }
  Tensor q_t() { return ref::view(q, 0, {shape.tokens, shape.hq, shape.dim}); }
  Tensor k_t() { return ref::view(k, 0, {shape.tokens, shape.hk, shape.dim}); }
  Tensor pos_t() { return ref::view(positions, 0, {shape.tokens}); }
  QkNorm norm(double eps) {
    QkNorm n;
    n.q_weight = ref::view(q_weight, 0, {shape.dim});
    n.k_weight = ref::view(k_weight, 0, {shape.dim});
    n.eps = static_cast<float>(eps);
    n.unit_offset = unit_offset;
    return n;
  }
  QkNorm norm_q_only(double eps) {
    QkNorm n = norm(eps);
    n.k_weight.reset();
    return n;
  }
  std::vector<double> factors(bool is_q) const {
    const ref::Buffer& w = is_q ? q_weight : k_weight;
    std::vector<double> f(static_cast<std::size_t>(shape.dim));
    for (std::int64_t j = 0; j < shape.dim; ++j) {
      f[static_cast<std::size_t>(j)] = unit_offset ? 1.0 + w.get(j) : w.get(j);
    }
    return f;
  }
};

std::vector<double> row_of(const ref::Buffer& b, std::int64_t row, std::int64_t dim) {
  std::vector<double> v(static_cast<std::size_t>(dim));
  for (std::int64_t j = 0; j < dim; ++j) v[static_cast<std::size_t>(j)] = b.get(row * dim + j);
  return v;
}

// Checks out (the rows of q or k after the call) against the float64 forward of `in`.
void check_forward(const ref::Buffer& in, const ref::Buffer& out, std::int64_t heads,
                   const Inputs& x, double eps, bool interleaved, ref::Mismatches& mm, bool is_q) {
  const Shape& s = x.shape;
  const std::vector<double> wf = x.factors(is_q);
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t row = t * heads + h;
      std::vector<double> magnitude;
      const std::vector<double> want =
          reference_row(row_of(in, row, s.dim), wf, eps, x.positions.get_index(t), s.rotary,
                        interleaved, false, &magnitude);
      const double row_norm = ref::norm(want);
      for (std::int64_t j = 0; j < s.dim; ++j) {
        const double w = want[static_cast<std::size_t>(j)];
        // float32: the row's sum of squares and rstd carry a few float32 ulps (the sum is a
        // tree of depth 8 of positive terms), so 4e-6 of the row's norm; 16-bit: one ulp of
        // the output plus the float32 error of the terms before the one rounding.
        const double tol =
            x.dtype == DType::float32
                ? 4e-6 * row_norm
                : ref::ulp(x.dtype, w) + std::ldexp(magnitude[static_cast<std::size_t>(j)], -19);
        mm.expect_close(
            [&] {
              return ref::where(is_q ? "q" : "k", {t, h, j});
            },
            out.get(row * s.dim + j), w, tol);
      }
    }
  }
}

RopeCache cache_for(std::int64_t rotary) {
  return RopeCache({rotary, kBase, kMaxPositions});
}

}  // namespace

TEST_CASE("apply_qk_norm_rope equals the float64 norm-then-rotate reference", "[qk_norm_rope]") {
  const Shape shapes[] = {{5, 4, 2, 64, 64},   {3, 2, 1, 80, 80},   {3, 2, 2, 96, 96},
                          {4, 4, 1, 128, 128}, {2, 2, 1, 256, 256}, {3, 3, 1, 128, 64},
                          {3, 2, 1, 17, 16},   {2, 2, 2, 96, 32},   {2, 1, 1, 300, 300}};
  for (const Shape& s : shapes) {
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
      for (bool interleaved : {false, true}) {
        for (bool unit : {false, true}) {
          const DType wdtype = unit ? dtype : DType::float32;
          INFO("D " << s.dim << " R " << s.rotary << " dtype " << embrope::dtype_name(dtype)
                    << " interleaved " << interleaved << " unit_offset " << unit);
          Inputs x(s, dtype, wdtype, unit,
                   ref::seed_of({s.dim, s.rotary, int(dtype), interleaved, unit}));
          const ref::Buffer q_in = x.q, k_in = x.k;
          RopeOptions o;
          o.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
          const double eps = 1e-6;
          embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache_for(s.rotary), x.norm(eps),
                                      o);
          ref::Mismatches mm;
          check_forward(q_in, x.q, s.hq, x, eps, interleaved, mm, true);
          check_forward(k_in, x.k, s.hk, x, eps, interleaved, mm, false);
          INFO(mm.summary());
          CHECK(mm.count == 0);
        }
      }
    }
  }
}

TEST_CASE("apply_qk_norm_rope: [B, S, H, D], int32 positions, caller tables, out of place",
          "[qk_norm_rope]") {
  const std::int64_t batch = 2, seq = 3, hq = 4, hk = 2, dim = 64, rotary = 32;
  const Shape s{batch * seq, hq, hk, dim, rotary};
  Inputs x(s, DType::bfloat16, DType::bfloat16, false, 77);
  // Caller tables [P, R/2] in float32 from float64 cos and sin.
  ref::Buffer cos(DType::float32, kMaxPositions * rotary / 2),
      sin(DType::float32, kMaxPositions * rotary / 2);
  for (std::int64_t p = 0; p < kMaxPositions; ++p) {
    std::vector<double> c, sn;
    ref::rope_cos_sin(p, rotary, kBase, c, sn);
    for (std::int64_t i = 0; i < rotary / 2; ++i) {
      cos.set(p * rotary / 2 + i, c[static_cast<std::size_t>(i)]);
      sin.set(p * rotary / 2 + i, sn[static_cast<std::size_t>(i)]);
    }
  }
  ref::Buffer pos32(DType::int32, batch * seq);
  for (std::int64_t t = 0; t < batch * seq; ++t) pos32.set_index(t, x.positions.get_index(t));
  ref::Buffer q_out(DType::bfloat16, batch * seq * hq * dim),
      k_out(DType::bfloat16, batch * seq * hk * dim);
  ref::poison(q_out);
  ref::poison(k_out);
  const auto q_before = x.q.snapshot();
  RopeOptions o;
  o.q_out = ref::view(q_out, 0, {batch, seq, hq, dim});
  o.k_out = ref::view(k_out, 0, {batch, seq, hk, dim});
  embrope::apply_qk_norm_rope(
      ref::view(x.q, 0, {batch, seq, hq, dim}), ref::view(x.k, 0, {batch, seq, hk, dim}),
      ref::view(pos32, 0, {batch, seq}), ref::view(cos, 0, {kMaxPositions, rotary / 2}),
      ref::view(sin, 0, {kMaxPositions, rotary / 2}), x.norm(1e-6), o);
  CHECK(x.q.snapshot() == q_before);  // the input is untouched
  ref::Mismatches mm;
  check_forward(x.q, q_out, hq, x, 1e-6, false, mm, true);
  check_forward(x.k, k_out, hk, x, 1e-6, false, mm, false);
  INFO(mm.summary());
  CHECK(mm.count == 0);

  // In place gives the same bits as out of place.
  embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache_for(rotary), x.norm(1e-6),
                              RopeOptions{});
  RopeOptions o2;
  ref::Buffer q_out2(DType::bfloat16, batch * seq * hq * dim);
  Inputs y(s, DType::bfloat16, DType::bfloat16, false, 77);
  o2.q_out = ref::view(q_out2, 0, {s.tokens, hq, dim});
  embrope::apply_qk_norm_rope(y.q_t(), std::nullopt, y.pos_t(), cache_for(rotary),
                              y.norm_q_only(1e-6), o2);
  CHECK(q_out2.snapshot() == x.q.snapshot());
}

TEST_CASE("apply_qk_norm_rope: all-zero rows, eps 0 and a large eps", "[qk_norm_rope]") {
  const Shape s{2, 2, 1, 64, 64};
  Inputs x(s, DType::float32, DType::float32, false, 5);
  for (std::int64_t j = 0; j < s.dim; ++j) x.q.set(j, 0.0);  // token 0, head 0 all zero
  SECTION("eps > 0: an all-zero row stays zero") {
    embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache_for(64), x.norm(1e-6));
    for (std::int64_t j = 0; j < s.dim; ++j) CHECK(x.q.get(j) == 0.0);
  }
  SECTION("eps 0: an all-zero row is NaN, as in PyTorch; other rows are finite") {
    embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache_for(64), x.norm(0.0));
    for (std::int64_t j = 0; j < s.dim; ++j) CHECK(std::isnan(x.q.get(j)));
    for (std::int64_t j = s.dim; j < 2 * s.dim; ++j) CHECK(std::isfinite(x.q.get(j)));
  }
  SECTION("a large eps enters rstd") {
    const ref::Buffer q_in = x.q, k_in = x.k;
    embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache_for(64), x.norm(10.0));
    ref::Mismatches mm;
    check_forward(q_in, x.q, s.hq, x, 10.0, false, mm, true);
    check_forward(k_in, x.k, s.hk, x, 10.0, false, mm, false);
    INFO(mm.summary());
    CHECK(mm.count == 0);
  }
}

TEST_CASE("apply_qk_norm_rope: no weights is weight 1; mrope; GQA with q only", "[qk_norm_rope]") {
  const Shape s{4, 2, 1, 64, 64};
  Inputs x(s, DType::float32, DType::float32, false, 9);
  for (std::int64_t j = 0; j < s.dim; ++j) {
    x.q_weight.set(j, 1.0);
    x.k_weight.set(j, 1.0);
  }
  const ref::Buffer q_in = x.q;
  QkNorm none;
  none.eps = 1e-6f;
  embrope::apply_qk_norm_rope(x.q_t(), std::nullopt, x.pos_t(), cache_for(64), none);
  ref::Mismatches mm;
  check_forward(q_in, x.q, s.hq, x, 1e-6, false, mm, true);
  INFO(mm.summary());
  CHECK(mm.count == 0);

  // mrope: sections [8, 12, 12] of R/2 = 32; the three streams of each token. The reference
  // rotates frequency i by the position of its section's stream.
  Inputs m(s, DType::float32, DType::float32, false, 10);
  ref::Buffer streams(DType::int64, 3 * s.tokens);
  ref::fill_random_indices(streams, 11, 0, kMaxPositions - 1);
  const ref::Buffer q0 = m.q;
  RopeOptions o;
  o.mrope_section = {8, 12, 12};
  embrope::apply_qk_norm_rope(m.q_t(), std::nullopt, ref::view(streams, 0, {3, s.tokens}),
                              cache_for(64), m.norm_q_only(1e-6), o);
  const std::vector<double> wf = m.factors(true);
  ref::Mismatches mr;
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    for (std::int64_t h = 0; h < s.hq; ++h) {
      const std::vector<double> xr = row_of(q0, t * s.hq + h, s.dim);
      double sum = 0.0;
      for (double v : xr) sum += v * v;
      const double rstd = 1.0 / std::sqrt(sum / s.dim + 1e-6);
      std::vector<double> want(xr.size());
      for (std::int64_t i = 0; i < 32; ++i) {
        const int stream = i < 8 ? 0 : (i < 20 ? 1 : 2);
        const double angle = static_cast<double>(streams.get_index(stream * s.tokens + t)) *
                             ref::rope_inv_freq(i, 64, kBase);
        const double a = xr[i] * rstd * wf[i], b = xr[i + 32] * rstd * wf[i + 32];
        want[i] = a * std::cos(angle) - b * std::sin(angle);
        want[i + 32] = a * std::sin(angle) + b * std::cos(angle);
      }
      const double row_norm = ref::norm(want);
      for (std::int64_t j = 0; j < s.dim; ++j) {
        mr.expect_close(
            [&] {
              return ref::where("q", {t, h, j});
            },
            m.q.get(t * s.hq * s.dim + h * s.dim + j), want[j], 4e-6 * row_norm);
      }
    }
  }
  INFO(mr.summary());
  CHECK(mr.count == 0);
}

TEST_CASE("apply_qk_norm_rope: a bad position zero-fills its token's rows and is reported",
          "[qk_norm_rope]") {
  const Shape s{3, 2, 1, 32, 32};
  Inputs x(s, DType::float32, DType::float32, false, 12);
  x.positions.set_index(1, kMaxPositions);
  expect_error(
      [&] {
        embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache_for(32), x.norm(1e-6));
      },
      {ErrorCode::index_out_of_range}, {"apply_qk_norm_rope", "positions"});
  for (std::int64_t j = 0; j < s.hq * s.dim; ++j) CHECK(x.q.get(s.hq * s.dim + j) == 0.0);
  for (std::int64_t j = 0; j < s.hk * s.dim; ++j) CHECK(x.k.get(s.hk * s.dim + j) == 0.0);
  CHECK(x.q.get(0) != 0.0);
}

namespace {

// The float64 gradient of L = sum(dy * forward(x, w)) for one row, by central differences of
// the float64 forward (x and the weight factors perturbed one at a time).
void finite_difference_row(const std::vector<double>& x, const std::vector<double>& wf,
                           const std::vector<double>& dy, double eps, std::int64_t position,
                           std::int64_t rotary, bool interleaved, std::vector<double>& dx,
                           std::vector<double>& dw) {
  const auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
    const std::vector<double> y = reference_row(xv, wv, eps, position, rotary, interleaved, false);
    double l = 0.0;
    for (std::size_t j = 0; j < y.size(); ++j) l += dy[j] * y[j];
    return l;
  };
  const double h = 1e-6;
  dx.assign(x.size(), 0.0);
  dw.assign(x.size(), 0.0);
  for (std::size_t j = 0; j < x.size(); ++j) {
    std::vector<double> xp = x, xm = x, wp = wf, wm = wf;
    xp[j] += h;
    xm[j] -= h;
    wp[j] += h;
    wm[j] -= h;
    dx[j] = (loss(xp, wf) - loss(xm, wf)) / (2 * h);
    dw[j] = (loss(x, wp) - loss(x, wm)) / (2 * h);
  }
}

}  // namespace

TEST_CASE("apply_qk_norm_rope_backward equals central finite differences of the forward",
          "[qk_norm_rope][backward]") {
  const Shape shapes[] = {{3, 2, 1, 64, 64}, {2, 2, 2, 80, 32}, {3, 1, 1, 17, 16}};
  for (const Shape& s : shapes) {
    for (bool interleaved : {false, true}) {
      for (bool unit : {false, true}) {
        INFO("D " << s.dim << " R " << s.rotary << " interleaved " << interleaved << " unit "
                  << unit);
        Inputs x(s, DType::float32, DType::float32, unit,
                 ref::seed_of({s.dim, interleaved, unit, 3}));
        ref::Buffer dq(DType::float32, s.tokens * s.hq * s.dim),
            dk(DType::float32, s.tokens * s.hk * s.dim);
        ref::fill_random(dq, 21);
        ref::fill_random(dk, 22);
        const ref::Buffer dq_in = dq, dk_in = dk;
        ref::Buffer gq(DType::float32, s.dim), gk(DType::float32, s.dim);
        QkNormGradients grads;
        grads.q_weight = ref::view(gq, 0, {s.dim});
        grads.k_weight = ref::view(gk, 0, {s.dim});
        RopeOptions o;
        o.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
        const double eps = 1e-6;
        embrope::apply_qk_norm_rope_backward(
            ref::view(dq, 0, {s.tokens, s.hq, s.dim}), ref::view(dk, 0, {s.tokens, s.hk, s.dim}),
            x.q_t(), x.k_t(), x.pos_t(), cache_for(s.rotary), x.norm(eps), grads, o);
        ref::Mismatches mm;
        for (bool is_q : {true, false}) {
          const std::int64_t heads = is_q ? s.hq : s.hk;
          const ref::Buffer& in = is_q ? x.q : x.k;
          const ref::Buffer& dy = is_q ? dq_in : dk_in;
          const ref::Buffer& got = is_q ? dq : dk;
          const ref::Buffer& got_w = is_q ? gq : gk;
          std::vector<double> dw_sum(static_cast<std::size_t>(s.dim), 0.0);
          for (std::int64_t r = 0; r < s.tokens * heads; ++r) {
            std::vector<double> dx, dw;
            finite_difference_row(row_of(in, r, s.dim), x.factors(is_q), row_of(dy, r, s.dim), eps,
                                  x.positions.get_index(r / heads), s.rotary, interleaved, dx, dw);
            const double scale = ref::norm(dx) + 1e-3;
            for (std::int64_t j = 0; j < s.dim; ++j) {
              dw_sum[j] += dw[j];
              mm.expect_close(
                  [&] {
                    return ref::where(is_q ? "dq" : "dk", {r, j});
                  },
                  got.get(r * s.dim + j), dx[j], 1e-5 * scale);
            }
          }
          const double w_scale = ref::norm(dw_sum) + 1e-3;
          for (std::int64_t j = 0; j < s.dim; ++j) {
            mm.expect_close([&] { return ref::where(is_q ? "dq_weight" : "dk_weight", {j}); },
                            got_w.get(j), dw_sum[j], 1e-5 * w_scale);
          }
        }
        INFO(mm.summary());
        CHECK(mm.count == 0);
      }
    }
  }
}

TEST_CASE("apply_qk_norm_rope_backward equals the unfused composition's backward",
          "[qk_norm_rope][backward]") {
  // The unfused composition: n = rmsnorm(x), y = rope(n). Its backward: g = apply_rope_backward
  // (dy) (the library's own op), then the RMSNorm gradient from its float64 formula:
  // dx = rstd (u - xhat mean(u xhat)), u = w g; dw = sum g xhat.
  const Shape s{70, 4, 2, 128, 96};  // more rows than one weight-gradient chunk
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    INFO("dtype " << embrope::dtype_name(dtype));
    Inputs x(s, dtype, DType::float32, false, 31);
    ref::Buffer dq(dtype, s.tokens * s.hq * s.dim), dk(dtype, s.tokens * s.hk * s.dim);
    ref::fill_random(dq, 32);
    ref::fill_random(dk, 33);
    ref::Buffer gq(DType::float32, s.tokens * s.hq * s.dim),
        gk(DType::float32, s.tokens * s.hk * s.dim);
    for (std::int64_t i = 0; i < gq.size(); ++i) gq.set(i, dq.get(i));
    for (std::int64_t i = 0; i < gk.size(); ++i) gk.set(i, dk.get(i));
    embrope::apply_rope_backward(ref::view(gq, 0, {s.tokens, s.hq, s.dim}),
                                 ref::view(gk, 0, {s.tokens, s.hk, s.dim}), x.pos_t(),
                                 cache_for(s.rotary));
    ref::Buffer wq(DType::float32, s.dim), wk(DType::float32, s.dim);
    QkNormGradients grads;
    grads.q_weight = ref::view(wq, 0, {s.dim});
    grads.k_weight = ref::view(wk, 0, {s.dim});
    embrope::apply_qk_norm_rope_backward(
        ref::view(dq, 0, {s.tokens, s.hq, s.dim}), ref::view(dk, 0, {s.tokens, s.hk, s.dim}),
        x.q_t(), x.k_t(), x.pos_t(), cache_for(s.rotary), x.norm(1e-6), grads);
    ref::Mismatches mm;
    for (bool is_q : {true, false}) {
      const std::int64_t heads = is_q ? s.hq : s.hk;
      const ref::Buffer& in = is_q ? x.q : x.k;
      const ref::Buffer& g = is_q ? gq : gk;
      const ref::Buffer& got = is_q ? dq : dk;
      const std::vector<double> wf = x.factors(is_q);
      std::vector<double> dw(static_cast<std::size_t>(s.dim), 0.0), dw_abs(dw);
      for (std::int64_t r = 0; r < s.tokens * heads; ++r) {
        const std::vector<double> xr = row_of(in, r, s.dim), gr = row_of(g, r, s.dim);
        double sum = 0.0;
        for (double v : xr) sum += v * v;
        const double rstd = 1.0 / std::sqrt(sum / s.dim + 1e-6);
        double mean_ux = 0.0;
        for (std::int64_t j = 0; j < s.dim; ++j) mean_ux += wf[j] * gr[j] * xr[j] * rstd;
        mean_ux /= static_cast<double>(s.dim);
        std::vector<double> want(static_cast<std::size_t>(s.dim));
        for (std::int64_t j = 0; j < s.dim; ++j) {
          want[j] = rstd * (wf[j] * gr[j] - xr[j] * rstd * mean_ux);
          dw[j] += gr[j] * xr[j] * rstd;
          dw_abs[j] += std::fabs(gr[j] * xr[j] * rstd);
        }
        const double row_norm = ref::norm(want);
        for (std::int64_t j = 0; j < s.dim; ++j) {
          const double tol = dtype == DType::float32 ? 1e-5 * row_norm
                                                     : ref::ulp(dtype, want[j]) + 1e-5 * row_norm;
          mm.expect_close(
              [&] {
                return ref::where(is_q ? "dq" : "dk", {r, j});
              },
              got.get(r * s.dim + j), want[j], tol);
        }
      }
      const ref::Buffer& got_w = is_q ? wq : wk;
      for (std::int64_t j = 0; j < s.dim; ++j) {
        // A float32 sum of rows*1 terms: its error is bounded by a few ulps of the sum of |terms|.
        mm.expect_close([&] { return ref::where(is_q ? "dq_weight" : "dk_weight", {j}); },
                        got_w.get(j), dw[j], 1e-5 * dw_abs[j] + 1e-30);
      }
    }
    INFO(mm.summary());
    CHECK(mm.count == 0);
  }
}

TEST_CASE(
    "apply_qk_norm_rope_backward: in place equals out of place, weight grads repeat, "
    "bad positions",
    "[qk_norm_rope][backward]") {
  const Shape s{130, 2, 1, 64, 64};
  Inputs x(s, DType::bfloat16, DType::float32, true, 41);
  ref::Buffer dq(DType::bfloat16, s.tokens * s.hq * s.dim);
  ref::fill_random(dq, 42);
  const ref::Buffer dq_in = dq;
  ref::Buffer out(DType::bfloat16, dq.size()), w1(DType::float32, s.dim), w2(DType::float32, s.dim);
  QkNormGradients g1, g2;
  g1.q_weight = ref::view(w1, 0, {s.dim});
  g2.q_weight = ref::view(w2, 0, {s.dim});
  QkNorm norm = x.norm(1e-6);
  norm.k_weight.reset();
  RopeOptions o;
  o.q_out = ref::view(out, 0, {s.tokens, s.hq, s.dim});
  embrope::apply_qk_norm_rope_backward(ref::view(dq, 0, {s.tokens, s.hq, s.dim}), std::nullopt,
                                       x.q_t(), std::nullopt, x.pos_t(), cache_for(64), norm, g1,
                                       o);
  CHECK(dq.snapshot() == dq_in.snapshot());
  embrope::apply_qk_norm_rope_backward(ref::view(dq, 0, {s.tokens, s.hq, s.dim}), std::nullopt,
                                       x.q_t(), std::nullopt, x.pos_t(), cache_for(64), norm, g2);
  CHECK(dq.snapshot() == out.snapshot());
  CHECK(w1.snapshot() == w2.snapshot());

  // A bad position: its rows' gradients are zero and it adds nothing to the weight gradient.
  ref::Buffer dq3 = dq_in, w3(DType::float32, s.dim);
  x.positions.set_index(7, -1);
  QkNormGradients g3;
  g3.q_weight = ref::view(w3, 0, {s.dim});
  expect_error(
      [&] {
        embrope::apply_qk_norm_rope_backward(ref::view(dq3, 0, {s.tokens, s.hq, s.dim}),
                                             std::nullopt, x.q_t(), std::nullopt, x.pos_t(),
                                             cache_for(64), norm, g3);
      },
      {ErrorCode::index_out_of_range}, {"apply_qk_norm_rope_backward", "positions"});
  for (std::int64_t j = 0; j < s.hq * s.dim; ++j) CHECK(dq3.get(7 * s.hq * s.dim + j) == 0.0);
  bool differs = false;
  for (std::int64_t j = 0; j < s.dim; ++j) differs = differs || w3.get(j) != w1.get(j);
  CHECK(differs);
}

TEST_CASE("apply_qk_norm_rope errors name the op, the argument and the rule",
          "[qk_norm_rope][errors]") {
  const Shape s{2, 2, 1, 32, 32};
  Inputs x(s, DType::float32, DType::float32, false, 51);
  const RopeCache cache = cache_for(32);
  auto fwd = [&](const QkNorm& n, const RopeOptions& o = {}) {
    embrope::apply_qk_norm_rope(x.q_t(), x.k_t(), x.pos_t(), cache, n, o);
  };
  const auto invalid = {ErrorCode::invalid_argument};
  QkNorm n = x.norm(1e-6);
  n.eps = -1.0f;
  expect_error([&] { fwd(n); }, invalid, {"apply_qk_norm_rope", "eps"});
  n = x.norm(1e-6);
  n.eps = std::nanf("");
  expect_error([&] { fwd(n); }, invalid, {"apply_qk_norm_rope", "eps"});
  n = x.norm(1e-6);
  n.q_weight = ref::view(x.q_weight, 0, {16});
  expect_error([&] { fwd(n); }, invalid, {"apply_qk_norm_rope", "q_weight", "head_dim"});
  ref::Buffer w16(DType::float16, 32);
  n = x.norm(1e-6);
  n.k_weight = ref::view(w16, 0, {32});
  expect_error([&] { fwd(n); }, invalid, {"apply_qk_norm_rope", "k_weight"});
  n = x.norm(1e-6);
  expect_error([&] { embrope::apply_qk_norm_rope(x.q_t(), std::nullopt, x.pos_t(), cache, n); },
               invalid, {"apply_qk_norm_rope", "k_weight", "k"});
  QkNorm bare;
  bare.unit_offset = true;
  expect_error([&] { fwd(bare); }, invalid, {"apply_qk_norm_rope", "unit_offset"});
  // An output on top of a weight.
  ref::Buffer big(DType::float32, s.tokens * s.hq * s.dim);
  n = x.norm(1e-6);
  n.q_weight = ref::view(big, 0, {32});
  RopeOptions o;
  o.q_out = ref::view(big, 0, {s.tokens, s.hq, s.dim});
  expect_error([&] { fwd(n, o); }, invalid, {"apply_qk_norm_rope", "q_out", "q_weight"});

  // The backward's own arguments.
  ref::Buffer dq(DType::float32, s.tokens * s.hq * s.dim), gw(DType::float32, 32),
      g64(DType::bfloat16, 32);
  auto bwd = [&](const Tensor& saved_q, const QkNorm& nn, const QkNormGradients& g) {
    embrope::apply_qk_norm_rope_backward(ref::view(dq, 0, {s.tokens, s.hq, s.dim}), std::nullopt,
                                         saved_q, std::nullopt, x.pos_t(), cache, nn, g);
  };
  QkNormGradients g;
  expect_error(
      [&] {
        bwd(ref::view(x.q, 0, {s.tokens, s.hq, 16}), x.norm(1e-6), g);
      },
      invalid, {"apply_qk_norm_rope_backward", "q", "dq"});
  g.q_weight = ref::view(gw, 0, {32});
  QkNorm no_weight;
  expect_error([&] { bwd(x.q_t(), no_weight, g); }, invalid,
               {"apply_qk_norm_rope_backward", "grads.q_weight", "q_weight"});
  g.q_weight = ref::view(g64, 0, {32});
  QkNorm qn = x.norm(1e-6);
  qn.k_weight.reset();
  expect_error([&] { bwd(x.q_t(), qn, g); }, invalid,
               {"apply_qk_norm_rope_backward", "grads.q_weight", "float32"});
  g.q_weight = ref::view(dq, 0, {32});
  expect_error([&] { bwd(x.q_t(), qn, g); }, invalid,
               {"apply_qk_norm_rope_backward", "grads.q_weight", "dq"});

  // With caller tables, a weight gradient on top of either one (sin's was written over).
  ref::Buffer cos(DType::float32, kMaxPositions * 16), sin(DType::float32, kMaxPositions * 16);
  ref::fill_random(cos, 52);
  ref::fill_random(sin, 53);
  auto bwd_tables = [&](const QkNormGradients& gg) {
    embrope::apply_qk_norm_rope_backward(
        ref::view(dq, 0, {s.tokens, s.hq, s.dim}), std::nullopt, x.q_t(), std::nullopt, x.pos_t(),
        ref::view(cos, 0, {kMaxPositions, 16}), ref::view(sin, 0, {kMaxPositions, 16}), qn, gg);
  };
  for (ref::Buffer* table : {&cos, &sin}) {
    const auto before = table->snapshot();
    g.q_weight = ref::view(*table, 0, {32});
    expect_error([&] { bwd_tables(g); }, invalid,
                 {"apply_qk_norm_rope_backward", "grads.q_weight", table == &cos ? "cos" : "sin"});
    CHECK(table->snapshot() == before);
  }
}

TEST_CASE(
    "apply_qk_norm_rope in float32 equals embed's rms_norm then apply_rope: a yarn cache, "
    "views of a fused QKV buffer, a deferred status",
    "[qk_norm_rope]") {
  // In float32 the fused op and the unfused pair round at the same steps: RMSNorm of each head
  // row (embed with rms_norm over the rows as a table), then the rotation of the normalised
  // rows with the same table. So the bits must agree, whatever the table holds.
  embrope::RopeConfig config{64, kBase, kMaxPositions};
  config.scaling = embrope::RopeScaling::yarn;
  config.factor = 4.0;
  config.original_max_positions = 128;
  const RopeCache cache(config);
  const std::int64_t tokens = 9, hq = 4, hk = 2, dim = 64, width = (hq + 2 * hk) * dim;
  ref::Buffer qkv(DType::float32, tokens * width), w(DType::float32, 2 * dim),
      positions(DType::int32, tokens);
  ref::fill_random(qkv, 61);
  ref::fill_random(w, 62);
  ref::fill_random_indices(positions, 63, 0, kMaxPositions - 1);
  const Tensor q = ref::view(qkv, 0, {tokens, hq, dim}, {width, dim, 1});
  const Tensor k = ref::view(qkv, hq * dim, {tokens, hk, dim}, {width, dim, 1});
  // The unfused pair: contiguous copies of q's and k's rows normalised into [rows, D] outputs.
  ref::Buffer q_rows(DType::float32, tokens * hq * dim), k_rows(DType::float32, tokens * hk * dim);
  ref::Buffer q_norm(DType::float32, q_rows.size()), k_norm(DType::float32, k_rows.size());
  ref::Buffer ids(DType::int64, tokens * hq);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < hq * dim; ++j)
      q_rows.set(t * hq * dim + j, qkv.get(t * width + j));
    for (std::int64_t j = 0; j < hk * dim; ++j) {
      k_rows.set(t * hk * dim + j, qkv.get(t * width + hq * dim + j));
    }
  }
  for (std::int64_t n = 0; n < tokens * hq; ++n) ids.set_index(n, n);
  for (bool is_q : {true, false}) {
    const std::int64_t rows = tokens * (is_q ? hq : hk);
    embrope::EmbedOptions e;
    e.norm = embrope::Normalization::rms_norm;
    e.norm_eps = 1e-6f;
    e.norm_weight = ref::view(w, is_q ? 0 : dim, {dim});
    embrope::embed(ref::view(is_q ? q_rows : k_rows, 0, {rows, dim}), ref::view(ids, 0, {rows}),
                   ref::view(is_q ? q_norm : k_norm, 0, {rows, dim}), e);
  }
  embrope::apply_rope(ref::view(q_norm, 0, {tokens, hq, dim}),
                      ref::view(k_norm, 0, {tokens, hk, dim}), ref::view(positions, 0, {tokens}),
                      cache);
  const ref::Buffer qkv_before = qkv;
  embrope::DeferredStatus status(embrope::Device::cpu());
  QkNorm norm;
  norm.q_weight = ref::view(w, 0, {dim});
  norm.k_weight = ref::view(w, dim, {dim});
  RopeOptions o;
  o.deferred = &status;
  embrope::apply_qk_norm_rope(q, k, ref::view(positions, 0, {tokens}), cache, norm, o);
  CHECK(status.ok());
  ref::Mismatches mm;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < hq * dim; ++j) {
      mm.expect_bits(
          [&] {
            return ref::where("q", {t, j});
          },
          qkv.bits(t * width + j), q_norm.bits(t * hq * dim + j));
    }
    for (std::int64_t j = 0; j < hk * dim; ++j) {
      mm.expect_bits(
          [&] {
            return ref::where("k", {t, j});
          },
          qkv.bits(t * width + hq * dim + j), k_norm.bits(t * hk * dim + j));
    }
  }
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = (hq + hk) * dim; j < width; ++j) {  // v: untouched
      mm.expect_bits(
          [&] {
            return ref::where("v", {t, j});
          },
          qkv.bits(t * width + j), qkv_before.bits(t * width + j));
    }
  }
  INFO(mm.summary());
  CHECK(mm.count == 0);
  // A bad position is recorded, not thrown.
  positions.set_index(4, -3);
  embrope::apply_qk_norm_rope(q, k, ref::view(positions, 0, {tokens}), cache, norm, o);
  CHECK_FALSE(status.ok());
}
