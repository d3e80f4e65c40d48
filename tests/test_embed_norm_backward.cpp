// embed_backward with embed's norm (EmbedBackwardOptions::norm): the tables' gradients and the
// norm's weight and bias gradients against a float64 reference written from the formulas
// (the LayerNorm / RMSNorm gradient, Ba et al. 2016 and Zhang & Sennrich 2019, as torch's
// native_layer_norm_backward computes it), over the value dtypes, odd and head-size D, saved
// pre-norm rows in float32 or the model's dtype, a direct pre-norm gradient, Gemma's unit
// offset; bitwise determinism across OpenMP thread counts; bad rows; no rows; argument errors.
#include <omp.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DType;
using embrope::EmbedBackwardOptions;
using embrope::ErrorCode;
using embrope::Normalization;

struct NormBackwardCase {
  DType dtype = DType::float32;  // grad_out (the forward's table dtype)
  DType pre_dtype = DType::float32;
  DType grad_dtype = DType::float32;  // the tables' gradients
  Normalization norm = Normalization::layer_norm;
  std::int64_t dim = 64, rows = 150, vocab = 20, max_positions = 40;
  bool weight = true, unit_offset = false, grad_pre = false;
  bool bias_grad = true;  // layer_norm only
  float eps = 1e-5f;
  double scale = 1.0;
  std::int64_t bad_row = -1;  // a row with a position outside the table (deferred)
  std::uint64_t seed = 1;
};

std::string describe(const NormBackwardCase& c) {
  return std::string(embrope::dtype_name(c.dtype)) + " pre " + embrope::dtype_name(c.pre_dtype) +
         " grads " + embrope::dtype_name(c.grad_dtype) +
         (c.norm == Normalization::layer_norm ? " layer_norm" : " rms_norm") + " D " +
         std::to_string(c.dim) + " rows " + std::to_string(c.rows) +
         (c.weight ? " weight" : " no weight") + (c.unit_offset ? " unit offset" : "") +
         (c.grad_pre ? " grad_pre" : "") + " scale " + std::to_string(c.scale) + " bad row " +
         std::to_string(c.bad_row);
}

struct NormBackwardRun {
  ref::Buffer table, position, weight_grad, bias_grad;
  std::optional<embrope::Error> error;
};

struct Inputs {
  ref::Buffer grad_out, pre, grad_pre, weight, ids, pids;
};

Inputs make_inputs(const NormBackwardCase& c) {
  const std::int64_t n = c.rows, d = c.dim;
  Inputs in{ref::Buffer(c.dtype, n * d),  ref::Buffer(c.pre_dtype, n * d),
            ref::Buffer(c.dtype, n * d),  ref::Buffer(DType::float32, d),
            ref::Buffer(DType::int64, n), ref::Buffer(DType::int32, n)};
  const auto seed = static_cast<std::int64_t>(c.seed);
  ref::fill_random(in.grad_out, ref::seed_of({seed, 1}));
  ref::fill_random(in.pre, ref::seed_of({seed, 2}));
  for (std::int64_t i = 0; i < n * d; ++i) {  // an offset mean, as embedding rows have
    in.pre.set(i, ref::round_to(c.pre_dtype, in.pre.get(i) + 0.25));
  }
  ref::fill_random(in.grad_pre, ref::seed_of({seed, 3}));
  ref::fill_random(in.weight, ref::seed_of({seed, 4}));
  for (std::int64_t j = 0; j < d; ++j) {  // around 1, or around 0 with the unit offset
    if (!c.unit_offset) in.weight.set(j, 1.0 + 0.5 * in.weight.get(j));
  }
  ref::fill_random_indices(in.ids, ref::seed_of({seed, 5}), 0, c.vocab - 1);
  ref::fill_random_indices(in.pids, ref::seed_of({seed, 6}), 0, c.max_positions - 1);
  if (c.bad_row >= 0) in.pids.set_index(c.bad_row, c.max_positions);
  return in;
}

// Runs embed_backward with the norm on the CPU into zero-initialised gradients (the norm's
// poisoned first: they are overwritten).
NormBackwardRun run(const NormBackwardCase& c, Inputs& in) {
  const std::int64_t n = c.rows, d = c.dim;
  NormBackwardRun r{ref::Buffer(c.grad_dtype, c.vocab * d),
                    ref::Buffer(c.grad_dtype, c.max_positions * d), ref::Buffer(DType::float32, d),
                    ref::Buffer(DType::float32, d), std::nullopt};
  for (ref::Buffer* b : {&r.table, &r.position}) {
    for (std::int64_t i = 0; i < b->size(); ++i) b->set(i, 0.0);
  }
  ref::poison(r.weight_grad);
  ref::poison(r.bias_grad);
  EmbedBackwardOptions o;
  o.scale = static_cast<float>(c.scale);
  o.norm = c.norm;
  o.norm_eps = c.eps;
  o.norm_unit_offset = c.unit_offset;
  o.pre_norm = ref::view(in.pre, 0, {n, d});
  if (c.weight) o.norm_weight = ref::view(in.weight, 0, {d});
  if (c.grad_pre) o.grad_pre_norm = ref::view(in.grad_pre, 0, {n, d});
  o.grad_norm_weight = ref::view(r.weight_grad, 0, {d});
  if (c.bias_grad && c.norm == Normalization::layer_norm) {
    o.grad_norm_bias = ref::view(r.bias_grad, 0, {d});
  }
  o.grad_position_table = ref::view(r.position, 0, {c.max_positions, d});
  o.position_ids = ref::view(in.pids, 0, {n});
  embrope::DeferredStatus status;
  o.deferred = &status;
  embrope::embed_backward(ref::view(in.grad_out, 0, {n, d}), ref::view(in.ids, 0, {n}),
                          ref::view(r.table, 0, {c.vocab, d}), o);
  try {
    status.check();
  } catch (const embrope::Error& e) {
    r.error = e;
  }
  return r;
}

// The float64 gradients: dx per row from the formulas, summed per table row; dw and db.
struct Expected {
  std::vector<double> table, table_tol, position, position_tol, weight, weight_tol, bias, bias_tol;
};

Expected reference(const NormBackwardCase& c, const Inputs& in) {
  const std::int64_t n = c.rows, d = c.dim;
  const double u32 = std::ldexp(1.0, -24);
  const auto size = [](std::int64_t k) { return static_cast<std::size_t>(k); };
  Expected e{std::vector<double>(size(c.vocab * d)),
             std::vector<double>(size(c.vocab * d)),
             std::vector<double>(size(c.max_positions * d)),
             std::vector<double>(size(c.max_positions * d)),
             std::vector<double>(size(d)),
             std::vector<double>(size(d)),
             std::vector<double>(size(d)),
             std::vector<double>(size(d))};
  std::vector<double> w(size(d), 1.0);
  for (std::int64_t j = 0; j < d; ++j) {
    if (c.weight) w[j] = c.unit_offset ? 1.0 + in.weight.get(j) : in.weight.get(j);
  }
  // A float32 computation of one dx element errs by a few roundings of each term, and by the
  // errors of mean, rstd and the two row sums (each within about D roundings of the sum of
  // its terms' magnitudes), carried through: kRow bounds them all, relative to the terms.
  const double k_row = 8.0 * static_cast<double>(d + 16) * u32;
  for (std::int64_t r = 0; r < n; ++r) {
    if (r == c.bad_row) continue;
    std::vector<double> x(size(d)), g(size(d)), z(size(d)), u(size(d));
    double mean = 0.0;
    for (std::int64_t j = 0; j < d; ++j) {
      x[j] = in.pre.get(r * d + j);
      g[j] = in.grad_out.get(r * d + j);
      if (c.norm == Normalization::layer_norm) mean += x[j] / static_cast<double>(d);
    }
    double var = 0.0;
    for (std::int64_t j = 0; j < d; ++j) var += (x[j] - mean) * (x[j] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(d) + c.eps);
    double mean_u = 0.0, mean_uz = 0.0, mag_u = 0.0, mag_uz = 0.0;
    for (std::int64_t j = 0; j < d; ++j) {
      z[j] = (x[j] - mean) * rstd;
      u[j] = w[j] * g[j];
      mean_uz += u[j] * z[j] / static_cast<double>(d);
      mag_uz += std::fabs(u[j] * z[j]) / static_cast<double>(d);
      if (c.norm == Normalization::layer_norm) {
        mean_u += u[j] / static_cast<double>(d);
        mag_u += std::fabs(u[j]) / static_cast<double>(d);
      }
    }
    const std::int64_t id = in.ids.get_index(r), pos = in.pids.get_index(r);
    for (std::int64_t j = 0; j < d; ++j) {
      double dx = rstd * (u[j] - mean_u - z[j] * mean_uz);
      double mag = rstd * (std::fabs(u[j]) + mag_u + std::fabs(z[j]) * mag_uz);
      if (c.grad_pre) {
        dx += in.grad_pre.get(r * d + j);
        mag += std::fabs(in.grad_pre.get(r * d + j));
      }
      const double tol = k_row * mag;
      // Each table sums its rows in float32 (one rounding per row, relative to the running
      // sum's magnitude, bounded by the rows' total magnitude) and scales once.
      e.table[size(id * d + j)] += c.scale * dx;
      e.table_tol[size(id * d + j)] += std::fabs(c.scale) * (tol + (n + 2) * u32 * mag);
      e.position[size(pos * d + j)] += dx;
      e.position_tol[size(pos * d + j)] += tol + (n + 2) * u32 * mag;
      e.weight[size(j)] += g[j] * z[j];
      e.weight_tol[size(j)] += std::fabs(g[j] * z[j]) * (k_row + (n + 2) * u32);
      e.bias[size(j)] += g[j];
      e.bias_tol[size(j)] += std::fabs(g[j]) * (n + 2) * u32;
    }
  }
  // The gradients' own rounding (one ulp: a float32 error near a rounding boundary can
  // move the result by one).
  for (std::size_t i = 0; i < e.table.size(); ++i) {
    e.table_tol[i] += ref::ulp(c.grad_dtype, e.table[i]);
  }
  for (std::size_t i = 0; i < e.position.size(); ++i) {
    e.position_tol[i] += ref::ulp(c.grad_dtype, e.position[i]);
  }
  return e;
}

void check_case(const NormBackwardCase& c) {
  INFO(describe(c));
  Inputs in = make_inputs(c);
  const NormBackwardRun got = run(c, in);
  const Expected want = reference(c, in);
  CHECK(got.error.has_value() == (c.bad_row >= 0));
  ref::Mismatches m;
  const std::int64_t d = c.dim;
  for (std::int64_t i = 0; i < c.vocab * d; ++i) {
    m.expect_close(
        [&] {
          return ref::where("grad_table", {i / d, i % d});
        },
        got.table.get(i), want.table[static_cast<std::size_t>(i)],
        want.table_tol[static_cast<std::size_t>(i)]);
  }
  for (std::int64_t i = 0; i < c.max_positions * d; ++i) {
    m.expect_close(
        [&] {
          return ref::where("grad_position_table", {i / d, i % d});
        },
        got.position.get(i), want.position[static_cast<std::size_t>(i)],
        want.position_tol[static_cast<std::size_t>(i)]);
  }
  const bool bias = c.bias_grad && c.norm == Normalization::layer_norm;
  for (std::int64_t j = 0; j < d; ++j) {
    m.expect_close([&] { return ref::where("grad_norm_weight", {j}); }, got.weight_grad.get(j),
                   want.weight[static_cast<std::size_t>(j)],
                   want.weight_tol[static_cast<std::size_t>(j)]);
    if (bias) {
      m.expect_close([&] { return ref::where("grad_norm_bias", {j}); }, got.bias_grad.get(j),
                     want.bias[static_cast<std::size_t>(j)],
                     want.bias_tol[static_cast<std::size_t>(j)]);
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(m.checked == (c.vocab + c.max_positions + (bias ? 2 : 1)) * d);
}

}  // namespace

TEST_CASE("embed_backward with a norm equals the float64 gradient of the norm",
          "[embed_backward][norm]") {
  std::uint64_t seed = 1;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (Normalization norm : {Normalization::layer_norm, Normalization::rms_norm}) {
      for (std::int64_t dim : {64, 100, 768}) {
        NormBackwardCase c;
        c.dtype = dtype;
        c.norm = norm;
        c.dim = dim;
        c.seed = seed++;
        c.pre_dtype = dim == 100 ? DType::float32 : dtype;  // saved as float32 or as the model's
        c.grad_dtype = dim == 768 ? dtype : DType::float32;
        c.grad_pre = dim != 64;
        c.scale = dim == 100 ? 2.5 : 1.0;
        check_case(c);
      }
    }
  }
}

TEST_CASE("embed_backward with a norm: unit-offset, absent weights, a large eps",
          "[embed_backward][norm]") {
  for (Normalization norm : {Normalization::layer_norm, Normalization::rms_norm}) {
    NormBackwardCase c;
    c.norm = norm;
    c.dtype = c.pre_dtype = c.grad_dtype = DType::bfloat16;
    c.unit_offset = true;
    check_case(c);
    c.unit_offset = false;
    c.weight = false;
    c.seed = 2;
    check_case(c);
    c.weight = true;
    c.eps = 0.5f;  // enters rstd visibly
    c.seed = 3;
    check_case(c);
  }
}

TEST_CASE("embed_backward with a norm: a bad row gives nothing to any gradient",
          "[embed_backward][norm][errors]") {
  NormBackwardCase c;
  c.bad_row = 70;  // in the second chunk of the weight gradients' order
  c.grad_pre = true;
  check_case(c);  // the reference leaves the row out; the deferred status reports it
  Inputs in = make_inputs(c);
  const NormBackwardRun got = run(c, in);
  REQUIRE(got.error.has_value());
  CHECK_THAT(got.error->what(), Catch::Contains("position_ids[70] = 40"));
}

TEST_CASE("embed_backward with a norm is bitwise deterministic across OpenMP thread counts",
          "[embed_backward][norm][determinism]") {
  NormBackwardCase c;
  c.dtype = c.pre_dtype = DType::bfloat16;
  c.rows = 1000;  // 16 chunks of the weight gradients, past the threading threshold
  c.dim = 96;
  c.grad_pre = true;
  Inputs in = make_inputs(c);
  const int threads = omp_get_max_threads();
  const NormBackwardRun first = run(c, in);
  omp_set_num_threads(1);
  const NormBackwardRun one = run(c, in);
  omp_set_num_threads(3);
  const NormBackwardRun three = run(c, in);
  omp_set_num_threads(threads);
  for (const NormBackwardRun* r : {&one, &three}) {
    CHECK(first.table.snapshot() == r->table.snapshot());
    CHECK(first.position.snapshot() == r->position.snapshot());
    CHECK(first.weight_grad.snapshot() == r->weight_grad.snapshot());
    CHECK(first.bias_grad.snapshot() == r->bias_grad.snapshot());
  }
}

TEST_CASE("embed_backward with a norm and no rows zeroes the norm's gradients",
          "[embed_backward][norm]") {
  ref::Buffer grad_out(DType::float32, 8), pre(DType::float32, 8), ids(DType::int64, 1);
  ref::Buffer weight_grad(DType::float32, 8), bias_grad(DType::float32, 8);
  ref::poison(weight_grad);
  ref::poison(bias_grad);
  EmbedBackwardOptions o;
  o.norm = Normalization::layer_norm;
  o.pre_norm = ref::view(pre, 0, {0, 8});
  o.grad_norm_weight = ref::view(weight_grad, 0, {8});
  o.grad_norm_bias = ref::view(bias_grad, 0, {8});
  embrope::embed_backward(ref::view(grad_out, 0, {0, 8}), ref::view(ids, 0, {0}), std::nullopt, o);
  for (std::int64_t j = 0; j < 8; ++j) {
    CHECK(weight_grad.get(j) == 0.0);
    CHECK(bias_grad.get(j) == 0.0);
  }
}

TEST_CASE("embed_backward with a norm rejects broken options with a message naming the rule",
          "[embed_backward][norm][errors]") {
  const std::int64_t n = 4, d = 8;
  ref::Buffer grad_out(DType::bfloat16, n * d), pre(DType::bfloat16, n * d), ids(DType::int64, n);
  ref::Buffer table_grad(DType::float32, 10 * d), weight(DType::float32, d);
  ref::Buffer weight_grad(DType::float32, d), half_grad(DType::bfloat16, d);
  ref::fill_random(grad_out, 1);
  ref::fill_random(pre, 2);
  ref::fill_random_indices(ids, 3, 0, 9);
  const auto call = [&](EmbedBackwardOptions o) {
    embrope::embed_backward(ref::view(grad_out, 0, {n, d}), ref::view(ids, 0, {n}),
                            ref::view(table_grad, 0, {10, d}), o);
  };
  const auto with_norm = [&] {
    EmbedBackwardOptions o;
    o.norm = Normalization::layer_norm;
    o.pre_norm = ref::view(pre, 0, {n, d});
    return o;
  };
  call(with_norm());  // the positive control: a valid call
  const std::initializer_list<ErrorCode> invalid = {ErrorCode::invalid_argument};

  EmbedBackwardOptions o = with_norm();
  o.pre_norm.reset();
  expect_error([&] { call(o); }, invalid, {"embed_backward", "pre_norm", "norm"});
  o = with_norm();
  o.pre_norm = ref::view(pre, 0, {n - 1, d});
  expect_error([&] { call(o); }, invalid, {"embed_backward", "pre_norm", "grad_out"});
  o = with_norm();
  o.norm = Normalization::rms_norm;
  o.grad_norm_bias = ref::view(weight_grad, 0, {d});
  expect_error([&] { call(o); }, invalid, {"grad_norm_bias", "rms_norm"});
  o = with_norm();
  o.grad_norm_weight = ref::view(half_grad, 0, {d});
  expect_error([&] { call(o); }, invalid, {"grad_norm_weight", "float32"});
  o = with_norm();
  o.grad_norm_weight = ref::view(weight_grad, 0, {d - 1});
  expect_error([&] { call(o); }, invalid, {"grad_norm_weight", "D"});
  o = with_norm();
  o.vocab_shard = true;
  expect_error([&] { call(o); }, invalid, {"norm", "vocab_shard"});
  o = with_norm();
  o.norm_eps = -1.0f;
  expect_error([&] { call(o); }, invalid, {"norm_eps"});
  o = with_norm();
  o.norm_unit_offset = true;
  expect_error([&] { call(o); }, invalid, {"norm_unit_offset", "norm_weight"});
  o = with_norm();
  o.norm_weight = ref::view(weight, 0, {d});
  o.grad_norm_weight = ref::view(weight, 0, {d});  // writes the weight it reads
  expect_error([&] { call(o); }, invalid, {"grad_norm_weight", "norm_weight"});
  o = EmbedBackwardOptions{};
  o.pre_norm = ref::view(pre, 0, {n, d});
  expect_error([&] { call(o); }, invalid, {"pre_norm", "norm is none"});
  o = EmbedBackwardOptions{};  // eps is not ignored when there is no norm
  o.norm_eps = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { call(o); }, invalid, {"norm_eps", ">= 0"});
  o = with_norm();
  o.norm = static_cast<Normalization>(7);
  expect_error([&] { call(o); }, invalid, {"norm 7", "Normalization"});
}
