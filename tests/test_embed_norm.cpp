// embed with a normalisation of the summed row (EmbedOptions::norm): LayerNorm and RMSNorm
// against a float64 reference written from the formulas (Ba et al. 2016; Zhang & Sennrich
// 2019), over head-size-like and odd D, every position encoding, token types, weight and bias
// dtypes, Gemma's unit-offset weight and the pre-norm output; properties that hold exactly
// (zero and constant rows, the pre-norm row is the lookup without a norm, the documented
// summation order); bad rows; argument errors.
#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DType;
using embrope::EmbedOptions;
using embrope::Error;
using embrope::ErrorCode;
using embrope::Normalization;
using embrope::PositionEncoding;
using embrope::Tensor;
using ref::Positions;

constexpr std::initializer_list<ErrorCode> kInvalid = {ErrorCode::invalid_argument};

struct NormCase {
  DType dtype = DType::float32;
  Normalization norm = Normalization::layer_norm;
  std::int64_t dim = 64, rows = 13, vocab = 40;
  Positions positions = Positions::none;
  bool types = false;
  double scale = 1.0;
  float eps = 1e-5f;
  bool weight = true, bias = true, unit_offset = false;
  DType weight_dtype = DType::float32;
  std::optional<DType> pre_norm;  // the pre-norm output's dtype, if written
  std::int64_t out_pad = 0, pre_pad = 0;
  std::uint64_t seed = 1;
};

std::string describe(const NormCase& c) {
  return std::string(embrope::dtype_name(c.dtype)) +
         (c.norm == Normalization::layer_norm ? " layer_norm" : " rms_norm") + " D " +
         std::to_string(c.dim) + " positions " + std::to_string(static_cast<int>(c.positions)) +
         (c.types ? " types" : "") + " scale " + std::to_string(c.scale) + " eps " +
         std::to_string(c.eps) + (c.weight ? " weight " : " no weight ") +
         embrope::dtype_name(c.weight_dtype) + (c.bias ? " bias" : "") +
         (c.unit_offset ? " unit offset" : "") +
         (c.pre_norm ? std::string(" pre_norm ") + embrope::dtype_name(*c.pre_norm) : "");
}

// The float64 normalisation of a summed row: y = (x - mean) / sqrt(var + eps) * w + b
// (layer_norm; var biased), or x / sqrt(mean(x^2) + eps) * w (rms_norm). rstd_out gets
// 1 / sqrt(...), z_out the normalised values before the weight.
std::vector<double> normalize(const std::vector<double>& x, Normalization norm, double eps,
                              const std::vector<double>& w, const std::vector<double>& b,
                              double* rstd_out, std::vector<double>* z_out) {
  const double n = static_cast<double>(x.size());
  double mean = 0.0;
  if (norm == Normalization::layer_norm) {
    for (double v : x) mean += v;
    mean /= n;
  }
  double var = 0.0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  const double rstd = 1.0 / std::sqrt(var + eps);
  std::vector<double> y(x.size());
  z_out->assign(x.size(), 0.0);
  for (std::size_t j = 0; j < x.size(); ++j) {
    (*z_out)[j] = (x[j] - mean) * rstd;
    y[j] = (*z_out)[j] * w[j] + b[j];
  }
  *rstd_out = rstd;
  return y;
}

struct NormRun {
  ref::Buffer out, pre;
  std::vector<std::vector<double>> want, want_pre;  // float64 per row
  std::vector<std::vector<double>> tol, tol_pre;
};

// Runs a case and returns the outputs with their float64 expectations and tolerances.
NormRun run_case(const NormCase& c) {
  const std::int64_t d = c.dim, rows = c.rows, max_p = 64;
  ref::Buffer table(c.dtype, c.vocab * d), ids(DType::int64, rows), pids(DType::int32, rows);
  ref::Buffer ptable(c.dtype, max_p * d), ttable(c.dtype, 3 * d), tids(DType::int64, rows);
  ref::Buffer weight(c.weight_dtype, d), bias(c.weight_dtype, d);
  ref::fill_random(table, ref::seed_of({static_cast<std::int64_t>(c.seed), 1}));
  ref::fill_random_indices(ids, ref::seed_of({static_cast<std::int64_t>(c.seed), 2}), 0,
                           c.vocab - 1);
  ref::fill_random_indices(pids, ref::seed_of({static_cast<std::int64_t>(c.seed), 3}), 0,
                           c.positions == Positions::sinusoidal ? 100000 : max_p - 1);
  ref::fill_random(ptable, ref::seed_of({static_cast<std::int64_t>(c.seed), 4}));
  ref::fill_random(ttable, ref::seed_of({static_cast<std::int64_t>(c.seed), 5}));
  ref::fill_random_indices(tids, ref::seed_of({static_cast<std::int64_t>(c.seed), 6}), 0, 2);
  ref::fill_random(weight, ref::seed_of({static_cast<std::int64_t>(c.seed), 7}));
  ref::fill_random(bias, ref::seed_of({static_cast<std::int64_t>(c.seed), 8}));
  for (std::int64_t j = 0; j < d; ++j) {  // weights around 1 (or around 0 with unit offset)
    if (!c.unit_offset) weight.set(j, ref::round_to(c.weight_dtype, 1.0 + 0.5 * weight.get(j)));
  }

  NormRun run;
  const std::int64_t ostride = d + c.out_pad, pstride = d + c.pre_pad;
  run.out = ref::Buffer(c.dtype, rows * ostride);
  ref::poison(run.out);
  EmbedOptions o;
  o.scale = static_cast<float>(c.scale);
  o.norm = c.norm;
  o.norm_eps = c.eps;
  o.norm_unit_offset = c.unit_offset;
  if (c.weight) o.norm_weight = ref::view(weight, 0, {d});
  if (c.bias) o.norm_bias = ref::view(bias, 0, {d});
  if (c.pre_norm) {
    run.pre = ref::Buffer(*c.pre_norm, rows * pstride);
    ref::poison(run.pre);
    o.pre_norm_out = ref::view(run.pre, 0, {rows, d}, {pstride, 1});
  }
  if (c.positions != Positions::none) {
    o.positions = c.positions == Positions::learned ? PositionEncoding::learned
                                                    : PositionEncoding::sinusoidal;
    if (c.positions == Positions::learned) o.position_table = ref::view(ptable, 0, {max_p, d});
    o.position_ids = ref::view(pids, 0, {rows});
  }
  if (c.types) {
    o.type_table = ref::view(ttable, 0, {3, d});
    o.type_ids = ref::view(tids, 0, {rows});
  }
  embrope::embed(ref::view(table, 0, {c.vocab, d}), ref::view(ids, 0, {rows}),
                 ref::view(run.out, 0, {rows, d}, {ostride, 1}), o);

  ref::EmbedSpec spec;
  spec.table = &table;
  spec.vocab = c.vocab;
  spec.dim = d;
  spec.table_stride = d;
  spec.scale = static_cast<double>(static_cast<float>(c.scale));
  spec.positions = c.positions;
  spec.position_table = &ptable;
  spec.max_positions = max_p;
  spec.position_stride = d;
  spec.type_table = c.types ? &ttable : nullptr;
  spec.num_types = 3;
  spec.type_stride = d;
  std::vector<double> w(static_cast<std::size_t>(d), 1.0), b(static_cast<std::size_t>(d), 0.0);
  for (std::int64_t j = 0; j < d; ++j) {
    if (c.weight) w[j] = c.unit_offset ? 1.0 + weight.get(j) : weight.get(j);
    if (c.bias) b[j] = bias.get(j);
  }
  const double u32 = std::ldexp(1.0, -24);
  for (std::int64_t n = 0; n < rows; ++n) {
    std::vector<double> x, mag, z;
    REQUIRE(ref::embed_row(spec, ids.get_index(n), pids.get_index(n), tids.get_index(n), x, mag));
    double rstd = 0.0, mean_mag = 0.0;
    for (double m : mag) mean_mag += m / static_cast<double>(d);
    const std::vector<double> y = normalize(x, c.norm, c.eps, w, b, &rstd, &z);
    // float32 error bound: the row's sum (4 roundings per element, relative to its terms'
    // magnitude), the mean and rstd (a few roundings each, and the inputs' errors through
    // them), the three rounded steps of the output; then the output's own rounding.
    std::vector<double> tol(static_cast<std::size_t>(d)), tol_pre(static_cast<std::size_t>(d));
    for (std::int64_t j = 0; j < d; ++j) {
      const double err32 =
          16 * u32 *
          (std::fabs(w[j]) * rstd * (mag[j] + mean_mag) + std::fabs(w[j] * z[j]) + std::fabs(b[j]));
      tol[j] = err32 + ref::ulp(c.dtype, y[j]) / 2;
      // A sinusoid term carries its own error: at most 4 u32 (docs/numerics.md: four float32
      // roundings of its factors and three of its products and sum, |sin a cos b| +
      // |cos a sin b| <= 1), plus that of composing the float64 angle (negligible here).
      tol_pre[j] = 4 * u32 * mag[j] + (c.positions == Positions::sinusoidal ? 4 * u32 : 0.0) +
                   (c.pre_norm ? ref::ulp(*c.pre_norm, x[j]) / 2 : 0.0);
    }
    run.want.push_back(y);
    run.want_pre.push_back(x);
    run.tol.push_back(tol);
    run.tol_pre.push_back(tol_pre);
  }
  return run;
}

void check_case(const NormCase& c) {
  INFO(describe(c));
  const NormRun run = run_case(c);
  ref::Mismatches m;
  const std::int64_t ostride = c.dim + c.out_pad, pstride = c.dim + c.pre_pad;
  for (std::int64_t n = 0; n < c.rows; ++n) {
    for (std::int64_t j = 0; j < c.dim; ++j) {
      m.expect_close(
          [&] {
            return ref::where("out", {n, j});
          },
          run.out.get(n * ostride + j), run.want[n][j], run.tol[n][j]);
      if (c.pre_norm) {
        m.expect_close(
            [&] {
              return ref::where("pre_norm_out", {n, j});
            },
            run.pre.get(n * pstride + j), run.want_pre[n][j], run.tol_pre[n][j]);
      }
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(m.checked == c.rows * c.dim * (c.pre_norm ? 2 : 1));
}

}  // namespace

TEST_CASE("embed + layer_norm / rms_norm equals the float64 reference", "[embed][norm]") {
  std::uint64_t seed = 100;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (Normalization norm : {Normalization::layer_norm, Normalization::rms_norm}) {
      // Head sizes of today's models, BERT's 384 and 768, odd and large sizes.
      for (std::int64_t dim : {64, 80, 96, 128, 256, 384, 768, 77, 1000, 4096}) {
        for (Positions positions : {Positions::none, Positions::learned, Positions::sinusoidal}) {
          if (positions == Positions::sinusoidal && dim % 2 != 0) continue;  // needs an even D
          NormCase c;
          c.dtype = dtype;
          c.norm = norm;
          c.dim = dim;
          c.positions = positions;
          c.seed = ++seed;
          // Vary the other options with the seed, so that every one meets every dtype.
          c.types = seed % 2 == 0;
          c.scale = seed % 3 == 0 ? 2.5 : 1.0;
          c.weight_dtype = seed % 4 < 2 ? DType::float32 : dtype;
          c.bias = norm == Normalization::layer_norm && seed % 5 != 0;
          c.weight = seed % 7 != 0;
          c.unit_offset = c.weight && seed % 3 == 1;
          c.eps = seed % 4 == 3 ? 1e-12f : 1e-5f;
          if (seed % 3 != 2) c.pre_norm = seed % 2 == 0 ? dtype : DType::float32;
          c.out_pad = seed % 2 == 1 ? 3 : 0;
          c.pre_pad = seed % 3 == 0 ? 5 : 0;
          check_case(c);
        }
      }
    }
  }
}

TEST_CASE("embed + norm: a large eps enters the statistics", "[embed][norm]") {
  // eps 0.5 against rows of variance about 1/3: a norm that ignored eps would be off by ~60%.
  for (Normalization norm : {Normalization::layer_norm, Normalization::rms_norm}) {
    NormCase c;
    c.norm = norm;
    c.bias = norm == Normalization::layer_norm;
    c.eps = 0.5f;
    c.dim = 128;
    check_case(c);
  }
}

TEST_CASE("embed + norm: the pre-norm row has the bits of embed without a norm", "[embed][norm]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    INFO(embrope::dtype_name(dtype));
    const std::int64_t v = 30, d = 200, n = 50, max_p = 60;
    ref::Buffer table(dtype, v * d), ptable(dtype, max_p * d), ids(DType::int64, n);
    ref::Buffer out(dtype, n * d), pre(dtype, n * d), plain(dtype, n * d);
    ref::fill_random(table, 1);
    ref::fill_random(ptable, 2);
    ref::fill_random_indices(ids, 3, 0, v - 1);
    EmbedOptions o;
    o.scale = 3.0f;
    o.positions = PositionEncoding::learned;
    o.position_table = ref::view(ptable, 0, {max_p, d});
    embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {1, n}),
                   ref::view(plain, 0, {1, n, d}), o);
    o.norm = Normalization::layer_norm;
    o.pre_norm_out = ref::view(pre, 0, {1, n, d});
    embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {1, n}),
                   ref::view(out, 0, {1, n, d}), o);
    CHECK(pre.snapshot() == plain.snapshot());
    CHECK(out.snapshot() != plain.snapshot());
  }
}

TEST_CASE("embed + norm: zero and constant rows", "[embed][norm]") {
  const std::int64_t v = 4, d = 256, n = 4;
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    INFO(embrope::dtype_name(dtype));
    ref::Buffer table(dtype, v * d), ids(DType::int64, n), out(dtype, n * d);
    ref::Buffer weight(DType::float32, d), bias(dtype, d);
    ref::fill_random(weight, 5);
    ref::fill_random(bias, 6);
    for (std::int64_t j = 0; j < d; ++j) {
      table.set(0 * d + j, 0.0);   // an all-zero row
      table.set(1 * d + j, 0.5);   // constant: sums of 0.5 over 256 elements are exact
      table.set(2 * d + j, -3.0);  // constant, negative
      table.set(3 * d + j, j % 2 == 0 ? 1.0 : -1.0);
    }
    for (std::int64_t i = 0; i < n; ++i) ids.set_index(i, i);
    auto run = [&](Normalization norm, float eps) {
      EmbedOptions o;
      o.norm = norm;
      o.norm_eps = eps;
      o.norm_weight = ref::view(weight, 0, {d});
      if (norm == Normalization::layer_norm) o.norm_bias = ref::view(bias, 0, {d});
      embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}), ref::view(out, 0, {n, d}),
                     o);
    };
    SECTION("layer_norm, eps > 0: a row with no variance gives the bias exactly") {
      run(Normalization::layer_norm, 1e-5f);
      for (std::int64_t row : {0, 1, 2}) {
        for (std::int64_t j = 0; j < d; ++j) CHECK(out.get(row * d + j) == bias.get(j));
      }
      // The +-1 row: mean 0, variance 1, so y = w / sqrt(1 + eps) * (+-1) + b.
      for (std::int64_t j = 0; j < d; ++j) {
        const double want =
            (j % 2 == 0 ? 1.0 : -1.0) / std::sqrt(1.0 + 1e-5) * weight.get(j) + bias.get(j);
        CHECK(out.get(3 * d + j) == Approx(want).margin(ref::ulp(dtype, want)));
      }
    }
    SECTION("rms_norm, eps > 0: the zero row stays zero; constant rows give +-w") {
      run(Normalization::rms_norm, 1e-6f);
      for (std::int64_t j = 0; j < d; ++j) {
        CHECK(out.get(j) == 0.0);
        const double w = weight.get(j);
        CHECK(out.get(1 * d + j) == Approx(w / std::sqrt(1.0 + 4e-6)).margin(ref::ulp(dtype, w)));
        CHECK(out.get(2 * d + j) ==
              Approx(-w / std::sqrt(1.0 + 1e-6 / 9.0)).margin(ref::ulp(dtype, w)));
      }
    }
    SECTION("eps = 0: an all-zero row is 0 / 0, NaN, as in PyTorch") {
      run(Normalization::layer_norm, 0.0f);
      for (std::int64_t j = 0; j < d; ++j) CHECK(std::isnan(out.get(j)));
      run(Normalization::rms_norm, 0.0f);
      for (std::int64_t j = 0; j < d; ++j) CHECK(std::isnan(out.get(j)));
    }
  }
}

TEST_CASE("embed + norm sums in the documented order (docs/numerics.md)", "[embed][norm]") {
  // float32 in and out, written here from the documented order: partial j % 256 of each row
  // summed in ascending j from +0, the partials combined by halving, mean = sum / D,
  // rstd = 1 / sqrt(sum((x - mean)^2) / D + eps), y = ((x - mean) * rstd) * w + b.
  // Equality of bits pins the order, which the GPU follows too.
  const std::int64_t v = 20, d = 1000, n = 20;
  ref::Buffer table(DType::float32, v * d), ids(DType::int64, n), out(DType::float32, n * d);
  ref::Buffer weight(DType::float32, d), bias(DType::float32, d);
  ref::fill_random(table, 11);
  ref::fill_random(weight, 12);
  ref::fill_random(bias, 13);
  ref::fill_random_indices(ids, 14, 0, v - 1);
  const auto* t = static_cast<const float*>(table.data());
  const auto* w = static_cast<const float*>(weight.data());
  const auto* b = static_cast<const float*>(bias.data());
  auto ordered_sum = [&](auto term) {
    std::vector<float> partial(256, 0.0f);
    for (std::int64_t j = 0; j < d; ++j) {
      volatile float s = partial[j % 256] + term(j);  // volatile: no contraction, no reordering
      partial[j % 256] = s;
    }
    for (int h = 128; h >= 1; h /= 2) {
      for (int m = 0; m < h; ++m) {
        volatile float s = partial[m] + partial[m + h];
        partial[m] = s;
      }
    }
    return partial[0];
  };
  for (Normalization norm : {Normalization::layer_norm, Normalization::rms_norm}) {
    INFO((norm == Normalization::layer_norm ? "layer_norm" : "rms_norm"));
    EmbedOptions o;
    o.norm = norm;
    o.norm_eps = 1e-5f;
    o.norm_weight = ref::view(weight, 0, {d});
    if (norm == Normalization::layer_norm) o.norm_bias = ref::view(bias, 0, {d});
    embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}), ref::view(out, 0, {n, d}),
                   o);
    const auto* got = static_cast<const float*>(out.data());
    std::int64_t differ = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const float* x = t + ids.get_index(r) * d;
      float mean = 0.0f;
      if (norm == Normalization::layer_norm) {
        mean = ordered_sum([&](std::int64_t j) { return x[j]; }) / static_cast<float>(d);
      }
      const float sq = ordered_sum([&](std::int64_t j) {
        volatile float dev = x[j] - mean;
        volatile float s = dev * dev;
        return static_cast<float>(s);
      });
      volatile float var = sq / static_cast<float>(d);
      volatile float denom = std::sqrt(var + 1e-5f);
      const float rstd = 1.0f / denom;
      for (std::int64_t j = 0; j < d; ++j) {
        volatile float z = (x[j] - mean) * rstd;
        volatile float zw = z * w[j];
        const float y = norm == Normalization::layer_norm ? zw + b[j] : zw + 0.0f;
        if (std::memcmp(&y, got + r * d + j, sizeof y) != 0) ++differ;
      }
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("embed + norm: a bad id zero-fills its row in out and pre_norm_out", "[embed][norm]") {
  const std::int64_t v = 10, d = 96, n = 30;
  ref::Buffer table(DType::bfloat16, v * d), ids(DType::int64, n), out(DType::bfloat16, n * d);
  ref::Buffer pre(DType::float32, n * d);
  ref::fill_random(table, 21);
  ref::fill_random_indices(ids, 22, 0, v - 1);
  ids.set_index(17, v + 4);
  ref::poison(out);
  ref::poison(pre);
  EmbedOptions o;
  o.norm = Normalization::rms_norm;
  o.pre_norm_out = ref::view(pre, 0, {n, d});
  expect_error(
      [&] {
        embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}),
                       ref::view(out, 0, {n, d}), o);
      },
      {ErrorCode::index_out_of_range}, {"embed", "ids[17] = 14"});
  for (std::int64_t j = 0; j < d; ++j) {
    CHECK(out.bits(17 * d + j) == 0);
    CHECK(pre.bits(17 * d + j) == 0);
  }
  // The other rows were written: row 16 holds the table row, normalised.
  double sq = 0.0;
  for (std::int64_t j = 0; j < d; ++j) sq += std::pow(table.get(ids.get_index(16) * d + j), 2);
  const double rstd = 1.0 / std::sqrt(sq / d + 1e-5);
  for (std::int64_t j = 0; j < d; ++j) {
    const double x = table.get(ids.get_index(16) * d + j);
    CHECK(pre.get(16 * d + j) == x);
    CHECK(out.get(16 * d + j) == Approx(x * rstd).margin(ref::ulp(DType::bfloat16, x * rstd)));
  }
}

TEST_CASE("embed + norm rejects broken options with a message naming the rule",
          "[embed][norm][errors]") {
  const std::int64_t v = 10, d = 8, n = 6;
  ref::Buffer table(DType::float16, v * d), ids(DType::int64, n), out(DType::float16, n * d);
  ref::Buffer w16(DType::float16, d), w_bf16(DType::bfloat16, d), w_long(DType::float32, d + 1);
  ref::Buffer pre(DType::float16, n * d), pre_bf16(DType::bfloat16, n * d);
  ref::fill_random(table, 31);
  ref::fill_random_indices(ids, 32, 0, v - 1);
  ref::poison(out);
  const auto before = out.snapshot();
  auto call = [&](const EmbedOptions& o) {
    embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}), ref::view(out, 0, {n, d}),
                   o);
  };
  auto layer = [&] {
    EmbedOptions o;
    o.norm = Normalization::layer_norm;
    return o;
  };
  SECTION("vocab_shard") {
    EmbedOptions o = layer();
    o.vocab_shard = true;
    expect_error([&] { call(o); }, kInvalid, {"embed", "vocab_shard", "partial sums"});
  }
  SECTION("negative, infinite and NaN eps") {
    for (float eps : {-1e-5f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      EmbedOptions o = layer();
      o.norm_eps = eps;
      expect_error([&] { call(o); }, kInvalid, {"embed", "norm_eps", ">= 0"});
      EmbedOptions without_norm;  // eps is not ignored when there is no norm
      without_norm.norm_eps = eps;
      expect_error([&] { call(without_norm); }, kInvalid, {"embed", "norm_eps", ">= 0"});
    }
  }
  SECTION("a bias with rms_norm") {
    EmbedOptions o;
    o.norm = Normalization::rms_norm;
    o.norm_bias = ref::view(w16, 0, {d});
    expect_error([&] { call(o); }, kInvalid, {"embed", "norm_bias", "layer_norm only"});
  }
  SECTION("norm tensors without a norm") {
    EmbedOptions o;
    o.pre_norm_out = ref::view(pre, 0, {n, d});
    expect_error([&] { call(o); }, kInvalid, {"embed", "pre_norm_out", "norm is none"});
    EmbedOptions u;
    u.norm_unit_offset = true;
    expect_error([&] { call(u); }, kInvalid, {"embed", "norm_unit_offset", "norm is none"});
  }
  SECTION("a unit offset without a weight") {
    EmbedOptions o = layer();
    o.norm_unit_offset = true;
    expect_error([&] { call(o); }, kInvalid, {"embed", "norm_unit_offset", "norm_weight"});
  }
  SECTION("a weight of another 16-bit dtype or the wrong length") {
    EmbedOptions o = layer();
    o.norm_weight = ref::view(w_bf16, 0, {d});
    expect_error([&] { call(o); }, kInvalid, {"embed", "norm_weight", "bfloat16", "float32 or"});
    o.norm_weight = ref::view(w_long, 0, {d + 1});
    expect_error([&] { call(o); }, kInvalid, {"embed", "norm_weight", "9", "8"});
  }
  SECTION("a pre-norm output of the wrong dtype, shape, or overlapping out") {
    EmbedOptions o = layer();
    o.pre_norm_out = ref::view(pre_bf16, 0, {n, d});
    expect_error([&] { call(o); }, kInvalid, {"embed", "pre_norm_out", "bfloat16"});
    o.pre_norm_out = ref::view(pre, 0, {n - 1, d});
    expect_error([&] { call(o); }, kInvalid, {"embed", "pre_norm_out", "shape of out"});
    o.pre_norm_out = ref::view(out, 0, {n, d});
    expect_error([&] { call(o); }, kInvalid, {"embed", "pre_norm_out", "out"});
  }
  // Last: a SECTION that returns before its siblings are reached hides them from Catch2.
  SECTION("positive control") {
    EmbedOptions o = layer();
    o.norm_weight = ref::view(w16, 0, {d});
    o.pre_norm_out = ref::view(pre, 0, {n, d});
    CHECK_NOTHROW(call(o));
    return;
  }
  CHECK(out.snapshot() == before);
}
