// embed_backward (docs/ops.md, docs/numerics.md, docs/errors.md) against an independent float64
// reference written here: a plain loop that adds every grad_out row into the table row of its id
// (position, type), skipping padding, shard misses and bad rows. Every grad_out dtype and gradient
// dtype, heavy repetition (one id everywhere), all-distinct ids, padding, shard boundaries, scale,
// accumulation into non-zero gradients, learned positions (explicit and implicit) and types
// fused in one call, bitwise determinism across runs and OpenMP thread counts, bad indices
// under both policies, and argument errors.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "embed_backward_cases.hpp"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::BackwardMode;
using embrope::DeferredStatus;
using embrope::DType;
using embrope::EmbedBackwardOptions;
using embrope::Error;
using embrope::ErrorCode;
using embrope::Tensor;
using op_cases::BackwardCase;

std::int64_t product(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1},
                         [](std::int64_t a, std::int64_t b) { return a * b; });
}

// A gradient table [rows, D] with padded rows and its float64 reference.
struct Grad {
  std::int64_t rows = 0, dim = 0, stride = 0;
  ref::Buffer buf;
  std::vector<double> want, magnitude;  // per element: reference value, sum of |terms|
  std::vector<std::int64_t> count;      // per row: the number of grad_out rows added

  void init(const BackwardCase& c, std::int64_t n_rows, std::uint64_t seed) {
    rows = n_rows;
    dim = c.dim;
    stride = c.dim + c.grad_pad;
    buf = ref::Buffer(c.grad_dtype, rows * stride);
    ref::fill_random(buf, seed);  // padding elements too: they must keep their bits
    if (c.zero_init) {
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t e = 0; e < c.dim; ++e) buf.set(r * stride + e, 0.0);
      }
    }
    want.assign(static_cast<std::size_t>(buf.size()), 0.0);
    magnitude.assign(want.size(), 0.0);
    for (std::int64_t i = 0; i < buf.size(); ++i) {
      want[static_cast<std::size_t>(i)] = buf.get(i);
      magnitude[static_cast<std::size_t>(i)] = std::fabs(buf.get(i));
    }
    count.assign(static_cast<std::size_t>(rows), 0);
  }
  Tensor view() { return ref::view(buf, 0, {rows, dim}, {stride, 1}); }
  void add(std::int64_t row, const std::vector<double>& g, double weight) {
    count[static_cast<std::size_t>(row)] += 1;
    for (std::size_t e = 0; e < g.size(); ++e) {
      const auto at = static_cast<std::size_t>(row * stride) + e;
      want[at] += weight * g[e];
      magnitude[at] += std::fabs(weight * g[e]);
    }
  }
  // Rows with additions within the float32 summation bound (plus one output ulp for
  // float16/bfloat16); every other element (untouched rows, row padding) keeps its bits.
  void check(const char* name, std::int64_t dim, const std::vector<std::uint64_t>& before,
             ref::Mismatches& m) const {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t k = count[static_cast<std::size_t>(r)];
      for (std::int64_t e = 0; e < stride; ++e) {
        const std::int64_t at = r * stride + e;
        const auto ua = static_cast<std::size_t>(at);
        auto loc = [&] { return ref::where(name, {r, e}) + " (" + std::to_string(k) + " rows)"; };
        if (k == 0 || e >= dim) {
          m.expect_bits(loc, buf.bits(at), before[ua]);
          continue;
        }
        // Recursive float32 summation of k terms, the product by scale and the final
        // addition: at most (k + 2) float32 unit roundoffs of the sum of magnitudes.
        const double f32_error = static_cast<double>(k + 2) * std::ldexp(magnitude[ua], -24);
        const double tol =
            buf.dtype() == DType::float32 ? f32_error : ref::ulp(buf.dtype(), want[ua]) + f32_error;
        m.expect_close(loc, buf.get(at), want[ua], tol);
      }
    }
  }
};

struct Outcome {
  std::optional<Error> error;
  Grad table, position, type;
};

// Runs embed_backward on fresh random inputs of case c and checks every gradient element
// against the float64 reference. Returns the gradients and the index error, if any.
Outcome run_backward(const BackwardCase& c, DeferredStatus* deferred = nullptr) {
  INFO(describe(c));
  Outcome result;
  const std::int64_t n_rows = product(c.ids_shape);
  const std::int64_t d = c.dim;
  const std::int64_t seq = c.ids_shape.empty() ? 1 : c.ids_shape.back();
  const std::int64_t batch = c.ids_shape.size() == 2 ? c.ids_shape[0] : 1;

  std::vector<std::int64_t> id_strides = ref::contiguous_strides(c.ids_shape);
  for (auto& st : id_strides) st *= c.id_stride;
  ref::Buffer ids(c.id_dtype, n_rows * c.id_stride);
  const std::int64_t lo = c.shard ? c.vocab_start - c.vocab / 2 : c.vocab_start;
  const std::int64_t hi =
      c.shard ? c.vocab_start + c.vocab + c.vocab / 2 : c.vocab_start + c.vocab - 1;
  ref::fill_random_indices(ids, ref::seed_of({c.seed, 2}), lo, hi);
  for (std::size_t i = 0; i < c.ids.size(); ++i) {
    ids.set_index(static_cast<std::int64_t>(i) * c.id_stride, c.ids[i]);
  }

  const std::int64_t ostride = d + c.out_pad;
  ref::Buffer grad_out(c.dtype, n_rows * ostride);
  ref::fill_random(grad_out, ref::seed_of({c.seed, 3}));
  std::vector<std::int64_t> out_shape = c.ids_shape;
  out_shape.push_back(d);
  std::vector<std::int64_t> out_strides = ref::contiguous_strides(c.ids_shape);
  for (auto& s : out_strides) s *= ostride;
  out_strides.push_back(1);

  EmbedBackwardOptions opt;
  opt.scale = static_cast<float>(c.scale);
  opt.vocab_start = c.vocab_start;
  opt.vocab_shard = c.shard;
  opt.padding_idx = c.padding;
  opt.mode = c.mode;
  opt.deferred = deferred;

  std::optional<Tensor> grad_table;
  if (c.token) {
    result.table.init(c, c.vocab, ref::seed_of({c.seed, 4}));
    grad_table = result.table.view();
  }

  ref::Buffer pos_ids, offsets;
  std::vector<std::int64_t> positions(static_cast<std::size_t>(n_rows), 0);
  if (c.learned) {
    result.position.init(c, c.max_positions, ref::seed_of({c.seed, 5}));
    opt.grad_position_table = result.position.view();
    if (c.explicit_positions) {
      pos_ids = ref::Buffer(DType::int32, n_rows);
      ref::fill_random_indices(pos_ids, ref::seed_of({c.seed, 6}), 0, c.max_positions - 1);
      for (std::size_t i = 0; i < c.position_ids.size(); ++i) {
        pos_ids.set_index(static_cast<std::int64_t>(i), c.position_ids[i]);
      }
      opt.position_ids = ref::view(pos_ids, 0, c.ids_shape);
      for (std::int64_t n = 0; n < n_rows; ++n) {
        positions[static_cast<std::size_t>(n)] = pos_ids.get_index(n);
      }
    } else {
      std::vector<std::int64_t> off(static_cast<std::size_t>(batch), 0);
      if (c.with_offsets) {
        offsets = ref::Buffer(DType::int64, batch);
        ref::fill_random_indices(offsets, ref::seed_of({c.seed, 7}), 0,
                                 std::max<std::int64_t>(c.max_positions - seq, 0));
        for (std::size_t i = 0; i < c.offsets.size(); ++i) {
          offsets.set_index(static_cast<std::int64_t>(i), c.offsets[i]);
        }
        for (std::int64_t b = 0; b < batch; ++b) {
          off[static_cast<std::size_t>(b)] = offsets.get_index(b);
        }
        opt.position_offsets = ref::view(offsets, 0, {batch});
      }
      for (std::int64_t n = 0; n < n_rows; ++n) {
        positions[static_cast<std::size_t>(n)] = off[static_cast<std::size_t>(n / seq)] + n % seq;
      }
    }
  }

  ref::Buffer type_ids;
  std::vector<std::int64_t> types(static_cast<std::size_t>(n_rows), 0);
  if (c.num_types > 0) {
    result.type.init(c, c.num_types, ref::seed_of({c.seed, 8}));
    opt.grad_type_table = result.type.view();
    type_ids = ref::Buffer(DType::int64, n_rows);
    ref::fill_random_indices(type_ids, ref::seed_of({c.seed, 9}), 0, c.num_types - 1);
    for (std::size_t i = 0; i < c.type_ids.size(); ++i) {
      type_ids.set_index(static_cast<std::int64_t>(i), c.type_ids[i]);
    }
    for (std::int64_t n = 0; n < n_rows; ++n) {
      types[static_cast<std::size_t>(n)] = type_ids.get_index(n);
    }
    opt.type_ids = ref::view(type_ids, 0, c.ids_shape);
  }

  const auto table_before = result.table.buf.snapshot();
  const auto position_before = result.position.buf.snapshot();
  const auto type_before = result.type.buf.snapshot();
  try {
    embrope::embed_backward(ref::view(grad_out, 0, out_shape, out_strides),
                            ref::view(ids, 0, c.ids_shape, id_strides), grad_table, opt);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::index_out_of_range) throw;
    result.error = e;
  }

  // The reference: a plain loop over rows (docs/ops.md, "embed_backward").
  const double scale = static_cast<double>(static_cast<float>(c.scale));
  std::vector<double> g(static_cast<std::size_t>(d));
  for (std::int64_t n = 0; n < n_rows; ++n) {
    const std::int64_t id = ids.get_index(n * c.id_stride);
    const bool hit = id >= c.vocab_start && id < c.vocab_start + c.vocab;
    bool bad = c.token && !hit && !c.shard;
    const std::int64_t p = positions[static_cast<std::size_t>(n)];
    if (c.learned && (p < 0 || p >= c.max_positions)) bad = true;
    const std::int64_t ty = types[static_cast<std::size_t>(n)];
    if (c.num_types > 0 && (ty < 0 || ty >= c.num_types)) bad = true;
    if (bad) continue;  // the forward zero-filled the row: no gradient anywhere
    for (std::int64_t e = 0; e < d; ++e)
      g[static_cast<std::size_t>(e)] = grad_out.get(n * ostride + e);
    if (c.token && hit && !(c.padding && id == *c.padding)) {
      result.table.add(id - c.vocab_start, g, scale);
    }
    if (c.learned) result.position.add(p, g, 1.0);
    if (c.num_types > 0) result.type.add(ty, g, 1.0);
  }
  ref::Mismatches m;
  if (c.token) result.table.check("grad_table", d, table_before, m);
  if (c.learned) result.position.check("grad_position_table", d, position_before, m);
  if (c.num_types > 0) result.type.check("grad_type_table", d, type_before, m);
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(m.checked > 0);
  return result;
}

void run_ok(const BackwardCase& c) {
  const Outcome o = run_backward(c);
  if (o.error) FAIL_CHECK("unexpected error: " << o.error->what() << " in case " << describe(c));
}

bool same_bits(const Grad& a, const Grad& b) {
  return a.buf.snapshot() == b.buf.snapshot();
}

std::int64_t case_seed(std::initializer_list<std::int64_t> parts) {
  return static_cast<std::int64_t>(ref::seed_of(parts));
}

}  // namespace

// ------------------------------------------------------------------ reductions ----------

TEST_CASE("embed_backward sums grad_out rows per id for every dtype pairing", "[embed_backward]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType grad_dtype : {DType::float32, dtype}) {
      for (DType id_dtype : {DType::int32, DType::int64}) {
        for (std::vector<std::int64_t> shape :
             {std::vector<std::int64_t>{}, {1}, {40}, {3, 17}, {2, 3, 5}}) {
          BackwardCase c;
          c.dtype = dtype;
          c.grad_dtype = grad_dtype;
          c.id_dtype = id_dtype;
          c.ids_shape = shape;
          c.dim = shape.size() == 2 ? 72 : 64;
          c.out_pad = shape.size() == 3 ? 3 : 0;
          c.grad_pad = shape.size() == 2 ? 5 : 0;
          c.seed = case_seed({static_cast<int>(dtype), static_cast<int>(grad_dtype),
                              static_cast<int>(id_dtype), static_cast<std::int64_t>(shape.size())});
          run_ok(c);
        }
      }
    }
  }
}

TEST_CASE("embed_backward reads strided ids and a padded grad_out", "[embed_backward][strided]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    BackwardCase c;
    c.dtype = dtype;
    c.ids_shape = {4, 25};
    c.id_stride = 3;
    c.out_pad = 5;
    c.grad_pad = 2;
    c.learned = true;
    c.num_types = 2;
    c.seed = case_seed({static_cast<int>(dtype), 77});
    run_ok(c);
  }
}

TEST_CASE("embed_backward with one id on every row (one long run across many chunks)",
          "[embed_backward]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (DType grad_dtype : {DType::float32, dtype}) {
      for (std::int64_t rows : {31, 32, 33, 1000, 4099}) {
        BackwardCase c;
        c.dtype = dtype;
        c.grad_dtype = grad_dtype;
        c.ids_shape = {rows};
        c.dim = 40;
        c.ids.assign(static_cast<std::size_t>(rows), 7);
        c.seed = case_seed({rows, static_cast<int>(dtype), static_cast<int>(grad_dtype)});
        run_ok(c);
      }
    }
  }
}

// The order is part of the contract (docs/numerics.md: ascending grad_out rows, chunks of 32
// summed from zero, the chunk sums added in order from zero, then existing + scale * sum,
// the product rounded first, in float32, then rounded once to the gradient's dtype): written
// out here from that text, the result must match bit for bit, whatever the runs' lengths (one
// row, several, exactly a chunk, a chunk and a row, hundreds of chunks) and the thread count.
// Random values make any other order differ in the last bits.
TEST_CASE("embed_backward sums each row in the documented order, bit for bit",
          "[embed_backward][determinism]") {
  constexpr std::int64_t kChunk = 32;
  const std::int64_t dim = 300;  // past one column block, not a multiple of a vector
  const std::int64_t vocab = 8;
  std::vector<std::int64_t> ids;
  for (std::int64_t n = 0; n < 2600; ++n) ids.push_back(n % 5 == 0 ? 1 : 3);  // long runs
  for (std::int64_t n = 0; n < 33; ++n) ids.insert(ids.begin() + 7 * n, 4);   // a chunk + 1
  for (std::int64_t n = 0; n < 32; ++n) ids.insert(ids.begin() + 11 * n, 5);  // a chunk
  for (std::int64_t n = 0; n < 17; ++n) ids.insert(ids.begin() + 13 * n, 6);  // several rows
  ids.insert(ids.begin() + 100, 0);                                           // one row
  const auto rows = static_cast<std::int64_t>(ids.size());
  const float scale = 0.75f;
  const std::pair<DType, DType> dtypes[] = {{DType::float32, DType::float32},
                                            {DType::bfloat16, DType::float32},
                                            {DType::bfloat16, DType::bfloat16},
                                            {DType::float16, DType::float16}};
  for (const auto& [dtype, grad_dtype] : dtypes) {
    INFO("grad_out " << embrope::dtype_name(dtype) << ", gradient "
                     << embrope::dtype_name(grad_dtype));
    ref::Buffer grad_out(dtype, rows * dim);
    ref::fill_random(grad_out, 91);
    ref::Buffer before(grad_dtype, vocab * dim);
    ref::fill_random(before, 92);

    ref::Buffer want(grad_dtype, vocab * dim);
    for (std::int64_t v = 0; v < vocab; ++v) {
      std::vector<std::int64_t> run;  // ascending grad_out rows of id v
      for (std::int64_t n = 0; n < rows; ++n) {
        if (ids[static_cast<std::size_t>(n)] == v) run.push_back(n);
      }
      for (std::int64_t e = 0; e < dim; ++e) {
        float total = 0.0f;
        for (std::size_t c = 0; c < run.size(); c += kChunk) {
          float part = 0.0f;
          for (std::size_t i = c; i < std::min(run.size(), c + kChunk); ++i) {
            part += static_cast<float>(grad_out.get(run[i] * dim + e));
          }
          total += part;
        }
        const std::int64_t at = v * dim + e;
        // volatile: the product rounded on its own, never contracted into an FMA.
        const volatile float product = scale * total;
        const float existing = static_cast<float>(before.get(at));
        if (run.empty()) {
          want.set_bits(at, before.bits(at));
        } else {
          want.set(at, static_cast<double>(existing + product));
        }
      }
    }

    const int threads = omp_get_max_threads();
    for (int team : {1, 2, 3}) {
      omp_set_num_threads(team);
      ref::Buffer grad(grad_dtype, vocab * dim);
      for (std::int64_t i = 0; i < grad.size(); ++i) grad.set_bits(i, before.bits(i));
      EmbedBackwardOptions options;
      options.scale = scale;
      embrope::embed_backward(ref::view(grad_out, 0, {rows, dim}, {dim, 1}),
                              Tensor(ids.data(), DType::int64, {rows}),
                              ref::view(grad, 0, {vocab, dim}, {dim, 1}), options);
      std::int64_t mismatches = 0;
      for (std::int64_t i = 0; i < vocab * dim; ++i) {
        if (grad.bits(i) != want.bits(i) && ++mismatches <= 3) {
          FAIL_CHECK(team << " threads: element (" << i / dim << ", " << i % dim << ") is "
                          << grad.get(i) << ", the documented order gives " << want.get(i));
        }
      }
      CHECK(mismatches == 0);
    }
    omp_set_num_threads(threads);
  }
}

TEST_CASE("embed_backward with all-distinct ids writes each row once", "[embed_backward]") {
  BackwardCase c;
  c.vocab = 300;
  c.ids_shape = {300};
  c.dim = 24;
  c.ids.resize(300);
  for (std::int64_t n = 0; n < 300; ++n) c.ids[static_cast<std::size_t>(n)] = (n * 7 + 3) % 300;
  for (DType grad_dtype : {DType::float32, DType::float16}) {
    c.dtype = grad_dtype;
    c.grad_dtype = grad_dtype;
    const Outcome o = run_backward(c);
    for (std::int64_t r = 0; r < 300; ++r) CHECK(o.table.count[static_cast<std::size_t>(r)] == 1);
  }
  SECTION("into a zero gradient: each row is exactly its grad_out row") {
    c.dtype = DType::float32;
    c.grad_dtype = DType::float32;
    c.zero_init = true;
    run_ok(c);
  }
}

TEST_CASE("embed_backward accumulates into a non-zero gradient and multiplies by scale",
          "[embed_backward]") {
  for (double scale : {2.5, -0.75, 1.0 / 3.0}) {
    for (DType grad_dtype : {DType::float32, DType::bfloat16}) {
      BackwardCase c;
      c.dtype = DType::bfloat16;
      c.grad_dtype = grad_dtype;
      c.scale = scale;
      c.ids_shape = {4, 50};
      c.vocab = 20;
      c.seed = case_seed({static_cast<std::int64_t>(scale * 100), static_cast<int>(grad_dtype)});
      run_ok(c);
    }
  }
}

TEST_CASE("embed_backward gives padding_idx rows no gradient", "[embed_backward][padding]") {
  BackwardCase c;
  c.vocab = 10;
  c.ids_shape = {2, 20};
  c.padding = 0;
  c.learned = true;
  c.explicit_positions = false;
  for (std::size_t n = 0; n < 40; n += 3)
    c.ids.push_back(0), c.ids.push_back(1), c.ids.push_back(0);
  c.ids.resize(40);
  const Outcome o = run_backward(c);
  CHECK_FALSE(o.error.has_value());
  // Row 0 got nothing (checked bitwise by run_backward); positions got every row.
  CHECK(o.table.count[0] == 0);
  std::int64_t position_rows = 0;
  for (std::int64_t k : o.position.count) position_rows += k;
  CHECK(position_rows == 40);
  SECTION("a padding id in a shard's numbering") {
    c.vocab_start = 1000;
    c.shard = true;
    c.padding = 1003;
    c.ids.assign(40, 1003);
    c.ids[5] = 1004;
    const Outcome s = run_backward(c);
    CHECK(s.table.count[3] == 0);
    CHECK(s.table.count[4] == 1);
  }
}

TEST_CASE("embed_backward over a vocab shard ignores ids just outside it",
          "[embed_backward][shard]") {
  BackwardCase c;
  c.vocab = 50;
  c.vocab_start = 100;
  c.shard = true;
  c.ids_shape = {8};
  c.ids = {99, 100, 149, 150, 0, 100, 149, 1 << 30};
  const Outcome o = run_backward(c);
  CHECK_FALSE(o.error.has_value());
  CHECK(o.table.count[0] == 2);
  CHECK(o.table.count[49] == 2);
  SECTION("without vocab_shard the first id outside is a bad index") {
    c.shard = false;
    const Outcome e = run_backward(c);
    REQUIRE(e.error.has_value());
    INFO(e.error->what());
    CHECK(e.error->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e.error->what(), Catch::Contains("embed_backward") &&
                                    Catch::Contains("ids[0] = 99") &&
                                    Catch::Contains("[100, 150)"));
  }
}

TEST_CASE("embed_backward: the shard gradients together are the full gradient, bit for bit",
          "[embed_backward][shard]") {
  // Each id's rows form the same run in its shard as in the full table, so the sums agree
  // exactly.
  const std::int64_t vocab = 40, dim = 16, rows = 300;
  ref::Buffer ids(DType::int64, rows), grad_out(DType::float32, rows * dim);
  ref::fill_random_indices(ids, 31, 0, vocab - 1);
  ref::fill_random(grad_out, 32);
  ref::Buffer full(DType::float32, vocab * dim), sharded(DType::float32, vocab * dim);
  ref::fill_random(full, 33);
  for (std::int64_t i = 0; i < full.size(); ++i) sharded.set_bits(i, full.bits(i));
  const Tensor g = ref::view(grad_out, 0, {rows, dim});
  const Tensor i = ref::view(ids, 0, {rows});
  EmbedBackwardOptions o;
  o.scale = 0.3f;
  embrope::embed_backward(g, i, ref::view(full, 0, {vocab, dim}), o);
  o.vocab_shard = true;
  for (std::int64_t start : {0, 13, 27}) {
    const std::int64_t end = start == 0 ? 13 : start == 13 ? 27 : vocab;
    o.vocab_start = start;
    embrope::embed_backward(g, i, ref::view(sharded, start * dim, {end - start, dim}), o);
  }
  CHECK(full.snapshot() == sharded.snapshot());
}

// --------------------------------------------------------------- positions, types ----

TEST_CASE("embed_backward fills learned position and type gradients in the same call",
          "[embed_backward][learned][types]") {
  for (DType dtype : {DType::float32, DType::float16}) {
    BackwardCase c;
    c.dtype = dtype;
    c.grad_dtype = dtype;
    c.learned = true;
    c.num_types = 3;
    c.scale = 1.5;
    c.vocab_start = 10;
    c.ids_shape = {3, 37};
    SECTION("explicit position_ids") {
      run_ok(c);
    }
    SECTION("implicit offset_b + s with position_offsets") {
      c.explicit_positions = false;
      c.with_offsets = true;
      c.max_positions = 60;
      run_ok(c);
    }
    SECTION("implicit 0..S-1 with one position per row, S > chunk") {
      c.explicit_positions = false;
      c.ids_shape = {200};
      c.max_positions = 200;
      run_ok(c);
    }
    SECTION("[S] ids with every row at position 5 and one type") {
      c.ids_shape = {100};
      c.position_ids.assign(100, 5);
      c.type_ids.assign(100, 2);
      run_ok(c);
    }
  }
}

TEST_CASE("embed_backward without grad_table (a frozen token table) ignores the ids",
          "[embed_backward][learned]") {
  BackwardCase c;
  c.token = false;
  c.learned = true;
  c.num_types = 2;
  c.ids = {-5, 1000, 3};
  run_ok(c);
}

// ---------------------------------------------------------------- determinism ---------

TEST_CASE("embed_backward is bitwise deterministic across runs and OpenMP thread counts",
          "[embed_backward][determinism]") {
  BackwardCase c;
  c.vocab = 64;
  c.dim = 96;  // rows * dim is past the threading threshold
  c.ids_shape = {4096};
  c.learned = true;
  c.max_positions = 4096;
  c.num_types = 2;
  // Heavy repetition: half the rows are one id.
  c.ids.resize(4096);
  for (std::int64_t n = 0; n < 4096; ++n) {
    c.ids[static_cast<std::size_t>(n)] = n % 2 == 0 ? 5 : (n * 13) % 64;
  }
  for (DType grad_dtype : {DType::float32, DType::bfloat16}) {
    c.dtype = DType::bfloat16;
    c.grad_dtype = grad_dtype;
    const int threads = omp_get_max_threads();
    const Outcome first = run_backward(c);
    const Outcome again = run_backward(c);
    omp_set_num_threads(1);
    const Outcome one = run_backward(c);
    omp_set_num_threads(3);
    const Outcome three = run_backward(c);
    omp_set_num_threads(threads);
    c.mode = BackwardMode::atomic;  // the CPU path is deterministic in either mode
    const Outcome atomic = run_backward(c);
    c.mode = BackwardMode::deterministic;
    for (const Outcome* o : {&again, &one, &three, &atomic}) {
      CHECK(same_bits(first.table, o->table));
      CHECK(same_bits(first.position, o->position));
      CHECK(same_bits(first.type, o->type));
    }
  }
}

// ------------------------------------------------------------------ bad indices -------

TEST_CASE("embed_backward: bad positions and type ids give no gradient and are reported",
          "[embed_backward][errors]") {
  BackwardCase c;
  c.learned = true;
  c.num_types = 2;
  c.ids_shape = {10};
  SECTION("a position outside the table") {
    c.position_ids = {0, 1, 2, 30, 4, -1, 6, 7, 8, 9};
    const Outcome o = run_backward(c);
    REQUIRE(o.error.has_value());
    CHECK_THAT(o.error->what(),
               Catch::Contains("embed_backward") && Catch::Contains("position_ids[3] = 30"));
  }
  SECTION("a type id outside the table") {
    c.type_ids = {0, 1, 0, 1, 0, 1, 0, 2, 0, 1};
    const Outcome o = run_backward(c);
    REQUIRE(o.error.has_value());
    CHECK_THAT(o.error->what(), Catch::Contains("type_ids[7] = 2"));
  }
}

TEST_CASE("embed_backward with a DeferredStatus returns normally and reports at check()",
          "[embed_backward][errors][deferred]") {
  DeferredStatus status;
  BackwardCase c;
  c.vocab = 10;
  c.ids_shape = {6};
  c.ids = {0, 9, 1, 12, 3, -1};
  const Outcome o = run_backward(c, &status);  // the good rows are checked
  CHECK_FALSE(o.error.has_value());
  CHECK_FALSE(status.ok());
  expect_error([&] { status.check(); }, {ErrorCode::index_out_of_range},
               {"embed_backward", "ids[3]", "12"});
  CHECK(status.ok());
}

// ------------------------------------------------------------------ argument errors -----

namespace {

struct Fixture {
  static constexpr std::int64_t v = 10, d = 8, n = 6;
  ref::Buffer grad_out{DType::float32, n* d};
  ref::Buffer ids{DType::int64, n};
  ref::Buffer grad{DType::float32, v* d};
  ref::Buffer grad16{DType::float16, v* d};
  ref::Buffer pos_grad{DType::float32, 16 * d};
  ref::Buffer pos_ids{DType::int64, n};
  std::vector<std::uint64_t> grad_before;
  Fixture() {
    ref::fill_random(grad_out, 1);
    ref::fill_random_indices(ids, 2, 0, v - 1);
    ref::fill_random(grad, 3);
    ref::fill_random(grad16, 4);
    ref::fill_random_indices(pos_ids, 5, 0, 15);
    grad_before = grad.snapshot();
  }
  Tensor g() { return ref::view(grad_out, 0, {n, d}); }
  Tensor i() { return ref::view(ids, 0, {n}); }
  Tensor t() { return ref::view(grad, 0, {v, d}); }
  bool untouched() const { return grad.snapshot() == grad_before; }
};

constexpr std::initializer_list<ErrorCode> kInvalid = {ErrorCode::invalid_argument};

}  // namespace

TEST_CASE("embed_backward error fixture is a valid call (positive control)",
          "[embed_backward][errors]") {
  Fixture f;
  CHECK_NOTHROW(embrope::embed_backward(f.g(), f.i(), f.t()));
  CHECK_FALSE(f.untouched());
  CHECK(embrope::embed_backward_workspace_size(f.g(), f.i(), f.t()) == 0);  // CPU
}

TEST_CASE("embed_backward rejects bad arguments with a message naming them",
          "[embed_backward][errors]") {
  Fixture f;
  EmbedBackwardOptions o;
  SECTION("grad_out of dtype int32") {
    ref::Buffer gi(DType::int32, f.n * f.d);
    expect_error(
        [&] {
          embrope::embed_backward(ref::view(gi, 0, {f.n, f.d}), f.i(), f.t());
        },
        kInvalid, {"embed_backward", "grad_out", "int32"});
  }
  SECTION("ids of dtype float32") {
    expect_error([&] { embrope::embed_backward(f.g(), ref::view(f.grad_out, 0, {f.n}), f.t()); },
                 kInvalid, {"embed_backward", "ids", "float32"});
  }
  SECTION("grad_table float16 with a float32 grad_out") {
    expect_error(
        [&] {
          embrope::embed_backward(f.g(), f.i(), ref::view(f.grad16, 0, {f.v, f.d}));
        },
        kInvalid, {"embed_backward", "grad_table", "float16", "float32"});
  }
  SECTION("grad_table with another D") {
    expect_error(
        [&] {
          embrope::embed_backward(f.g(), f.i(), ref::view(f.grad, 0, {f.v * 2, f.d / 2}));
        },
        kInvalid, {"embed_backward", "grad_table", "4", "8"});
  }
  SECTION("grad_out with another number of rows than ids") {
    expect_error(
        [&] {
          embrope::embed_backward(ref::view(f.grad_out, 0, {f.n - 1, f.d}), f.i(), f.t());
        },
        kInvalid, {"embed_backward", "grad_out", "5", "6"});
  }
  SECTION("grad_table with a strided last dimension") {
    expect_error(
        [&] {
          embrope::embed_backward(f.g(), f.i(), ref::view(f.grad, 0, {f.v / 2, f.d / 2}, {f.d, 2}));
        },
        kInvalid, {"embed_backward", "grad_table", "stride"});
  }
  SECTION("grad_table on another device") {
    const Tensor cuda_grad(f.grad.data(), DType::float32, {f.v, f.d}, embrope::Device::cuda(0));
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), cuda_grad); }, kInvalid,
                 {"embed_backward", "grad_table", "cuda:0", "cpu"});
  }
  SECTION("every tensor on a CUDA device in a build or machine without one") {
    const embrope::Device gpu = embrope::Device::cuda(0);
    if (embrope::cuda_device_count() == 0) {
      expect_error(
          [&] {
            embrope::embed_backward(Tensor(f.grad_out.data(), DType::float32, {f.n, f.d}, gpu),
                                    Tensor(f.ids.data(), DType::int64, {f.n}, gpu),
                                    Tensor(f.grad.data(), DType::float32, {f.v, f.d}, gpu));
          },
          {ErrorCode::not_implemented}, {"embed_backward"});
    }
  }
  SECTION("no gradient at all") {
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), std::nullopt); }, kInvalid,
                 {"embed_backward", "grad_table"});
  }
  SECTION("position_ids without grad_position_table") {
    o.position_ids = ref::view(f.pos_ids, 0, {f.n});
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "position_ids", "grad_position_table"});
  }
  SECTION("position_ids together with position_offsets") {
    o.grad_position_table = ref::view(f.pos_grad, 0, {16, f.d});
    o.position_ids = ref::view(f.pos_ids, 0, {f.n});
    o.position_offsets = ref::view(f.pos_ids, 0, {1});
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "position_ids", "position_offsets"});
  }
  SECTION("position_ids of another shape than ids") {
    o.grad_position_table = ref::view(f.pos_grad, 0, {16, f.d});
    o.position_ids = ref::view(f.pos_ids, 0, {2, 3});
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "position_ids"});
  }
  SECTION("grad_type_table without type_ids") {
    o.grad_type_table = ref::view(f.pos_grad, 0, {2, f.d});
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "grad_type_table", "type_ids"});
  }
  SECTION("a negative vocab_start") {
    o.vocab_start = -1;
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "vocab_start", "-1"});
  }
  SECTION("scale NaN") {
    o.scale = std::nanf("");
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "scale"});
  }
  SECTION("a negative padding_idx") {
    // No id is negative, so it would keep no row from grad_table (torch counts -1 from the end).
    o.padding_idx = -1;
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "padding_idx -1", "negative"});
  }
  SECTION("a mode that is neither") {
    o.mode = static_cast<BackwardMode>(7);
    expect_error([&] { embrope::embed_backward(f.g(), f.i(), f.t(), o); }, kInvalid,
                 {"embed_backward", "mode", "7"});
  }
  SECTION("the workspace query validates the same way") {
    expect_error(
        [&] {
          embrope::embed_backward_workspace_size(f.g(), f.i(), ref::view(f.grad16, 0, {f.v, f.d}));
        },
        kInvalid, {"embed_backward", "grad_table"});
  }
  CHECK(f.untouched());
}
