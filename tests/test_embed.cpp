// embed (docs/ops.md, docs/numerics.md, docs/errors.md) against the float64 reference of
// tests/reference.hpp: every value dtype and id dtype, id shapes from a scalar to 3-D, strided ids,
// tables and outputs, scale, vocab_start, vocab shards, learned and sinusoidal positions, token
// types, all fused; argument errors, bad ids/positions/types and the deferred policy.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "embrope/detail/numeric_types.hpp"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DeferredStatus;
using embrope::Device;
using embrope::DType;
using embrope::EmbedOptions;
using embrope::Error;
using embrope::ErrorCode;
using embrope::PositionEncoding;
using embrope::SinusoidLayout;
using embrope::Tensor;
using ref::Positions;

struct EmbedCase {
  DType dtype = DType::float32;
  DType id_dtype = DType::int64;
  std::int64_t vocab = 50, dim = 64;
  std::vector<std::int64_t> ids_shape = {7};  // empty: a 0-d scalar id
  // Strides of ids in elements; empty: row-major contiguous times id_stride.
  std::vector<std::int64_t> ids_strides;
  std::int64_t id_stride = 1;
  std::int64_t out_pad = 0;    // padding after each output row
  std::int64_t table_pad = 0;  // padding after each table row
  double scale = 1.0;
  std::int64_t vocab_start = 0;
  bool shard = false;
  Positions positions = Positions::none;
  bool explicit_positions = true;  // false: implicit offset_b + s
  bool with_offsets = false;       // implicit: position_offsets [B]
  DType position_dtype = DType::int64;
  std::int64_t max_positions = 40;  // learned table rows
  std::int64_t max_sinusoid_position = 1000;
  double base = 10000.0;
  bool split = false;
  std::int64_t num_types = 0;  // 0: no token types
  // Explicit values (flat row-major over the ids' shape); empty: random valid ones.
  std::vector<std::int64_t> ids, position_ids, type_ids, offsets;
  std::int64_t seed = 1;
};

std::string describe(const EmbedCase& c) {
  std::ostringstream os;
  os << "dtype " << embrope::dtype_name(c.dtype) << ", ids " << embrope::dtype_name(c.id_dtype)
     << " shape [";
  for (std::size_t i = 0; i < c.ids_shape.size(); ++i) os << (i ? "," : "") << c.ids_shape[i];
  os << "], V " << c.vocab << ", D " << c.dim << ", id_stride " << c.id_stride << ", out_pad "
     << c.out_pad << ", table_pad " << c.table_pad << ", scale " << c.scale << ", vocab_start "
     << c.vocab_start << (c.shard ? ", shard" : "") << ", positions "
     << (c.positions == Positions::none      ? "none"
         : c.positions == Positions::learned ? "learned"
                                             : "sinusoidal")
     << (c.positions == Positions::none ? ""
         : c.explicit_positions         ? " explicit"
         : c.with_offsets               ? " implicit with offsets"
                                        : " implicit")
     << (c.positions == Positions::sinusoidal ? (c.split ? " split" : " interleaved") : "")
     << ", base " << c.base << ", types " << c.num_types << ", seed " << c.seed;
  return os.str();
}

// Element offset of flat row n in a tensor of the given shape and strides.
std::int64_t offset_of(std::int64_t n, const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& strides) {
  std::int64_t off = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    off += (n % shape[d]) * strides[d];
    n /= shape[d];
  }
  return off;
}

std::int64_t product(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1},
                         [](std::int64_t a, std::int64_t b) { return a * b; });
}

std::vector<std::int64_t> scaled(std::vector<std::int64_t> v, std::int64_t k) {
  for (auto& x : v) x *= k;
  return v;
}

// Runs one embed case and checks every output row against the float64 reference (zero rows
// for bad ids, positions and type ids), and that the padding of out was not written. Returns
// the Error the call threw, if any (bad indices); any other exception propagates.
std::optional<Error> run_embed(const EmbedCase& c, DeferredStatus* deferred = nullptr) {
  INFO(describe(c));
  const std::int64_t n_rows = product(c.ids_shape);
  const std::int64_t d = c.dim;
  const bool batched_implicit = !c.explicit_positions && c.ids_shape.size() == 2;
  const std::int64_t seq = c.ids_shape.empty() ? 1 : c.ids_shape.back();
  const std::int64_t batch = batched_implicit ? c.ids_shape[0] : 1;

  // Token table [V, D] with padded rows.
  const std::int64_t tstride = d + c.table_pad;
  ref::Buffer table(c.dtype, c.vocab * tstride);
  ref::fill_random(table, ref::seed_of({c.seed, 1}));

  // ids, possibly strided.
  const std::vector<std::int64_t> id_strides =
      !c.ids_strides.empty() ? c.ids_strides
                             : scaled(ref::contiguous_strides(c.ids_shape), c.id_stride);
  std::int64_t id_extent = 1;
  for (std::size_t i = 0; i < c.ids_shape.size(); ++i) {
    id_extent += (c.ids_shape[i] - 1) * id_strides[i];
  }
  ref::Buffer ids(c.id_dtype, id_extent);
  const std::int64_t lo = c.shard ? c.vocab_start - c.vocab / 2 : c.vocab_start;
  const std::int64_t hi =
      c.shard ? c.vocab_start + c.vocab + c.vocab / 2 : c.vocab_start + c.vocab - 1;
  ref::fill_random_indices(ids, ref::seed_of({c.seed, 2}), lo, hi);
  for (std::size_t i = 0; i < c.ids.size(); ++i) {
    ids.set_index(offset_of(static_cast<std::int64_t>(i), c.ids_shape, id_strides), c.ids[i]);
  }
  auto id_of = [&](std::int64_t n) { return ids.get_index(offset_of(n, c.ids_shape, id_strides)); };

  // out [ids..., D] with padded rows, poisoned.
  const std::int64_t ostride = d + c.out_pad;
  ref::Buffer out(c.dtype, n_rows * ostride);
  ref::poison(out);
  const auto out_before = out.snapshot();
  std::vector<std::int64_t> out_shape = c.ids_shape;
  out_shape.push_back(d);
  std::vector<std::int64_t> out_strides = scaled(ref::contiguous_strides(c.ids_shape), ostride);
  out_strides.push_back(1);

  EmbedOptions opt;
  opt.scale = static_cast<float>(c.scale);
  opt.vocab_start = c.vocab_start;
  opt.vocab_shard = c.shard;
  opt.deferred = deferred;

  // Positions.
  ref::Buffer pos_table, pos_ids, offsets;
  const std::int64_t pstride = d + 1;
  std::vector<std::int64_t> positions(static_cast<std::size_t>(n_rows), 0);
  if (c.positions != Positions::none) {
    opt.positions = c.positions == Positions::learned ? PositionEncoding::learned
                                                      : PositionEncoding::sinusoidal;
    opt.sinusoid_base = c.base;
    opt.sinusoid_layout = c.split ? SinusoidLayout::split : SinusoidLayout::interleaved;
    const std::int64_t max_p =
        c.positions == Positions::learned ? c.max_positions - 1 : c.max_sinusoid_position;
    if (c.positions == Positions::learned) {
      pos_table = ref::Buffer(c.dtype, c.max_positions * pstride);
      ref::fill_random(pos_table, ref::seed_of({c.seed, 3}));
      opt.position_table = ref::view(pos_table, 0, {c.max_positions, d}, {pstride, 1});
    }
    if (c.explicit_positions) {
      pos_ids = ref::Buffer(c.position_dtype, n_rows);
      ref::fill_random_indices(pos_ids, ref::seed_of({c.seed, 4}), 0, max_p);
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
        offsets = ref::Buffer(c.position_dtype, 2 * batch);  // stride 2
        ref::fill_random_indices(offsets, ref::seed_of({c.seed, 5}), 0,
                                 std::max<std::int64_t>(max_p - seq + 1, 0));
        for (std::size_t i = 0; i < c.offsets.size(); ++i) {
          offsets.set_index(2 * static_cast<std::int64_t>(i), c.offsets[i]);
        }
        for (std::int64_t ib = 0; ib < batch; ++ib) {
          off[static_cast<std::size_t>(ib)] = offsets.get_index(2 * ib);
        }
        opt.position_offsets = ref::view(offsets, 0, {batch}, {2});
      }
      for (std::int64_t n = 0; n < n_rows; ++n) {
        // offset + s saturates rather than wrapping (an offset near INT64_MAX stays out of range)
        const std::int64_t o = off[static_cast<std::size_t>(n / seq)];
        positions[static_cast<std::size_t>(n)] = o > INT64_MAX - n % seq ? INT64_MAX : o + n % seq;
      }
    }
  }

  // Token types.
  ref::Buffer type_table, type_ids;
  std::vector<std::int64_t> types(static_cast<std::size_t>(n_rows), 0);
  if (c.num_types > 0) {
    type_table = ref::Buffer(c.dtype, c.num_types * d);
    ref::fill_random(type_table, ref::seed_of({c.seed, 6}));
    type_ids = ref::Buffer(c.id_dtype, n_rows);
    ref::fill_random_indices(type_ids, ref::seed_of({c.seed, 7}), 0, c.num_types - 1);
    for (std::size_t i = 0; i < c.type_ids.size(); ++i) {
      type_ids.set_index(static_cast<std::int64_t>(i), c.type_ids[i]);
    }
    for (std::int64_t n = 0; n < n_rows; ++n) {
      types[static_cast<std::size_t>(n)] = type_ids.get_index(n);
    }
    opt.type_table = ref::view(type_table, 0, {c.num_types, d});
    opt.type_ids = ref::view(type_ids, 0, c.ids_shape);
  }

  std::optional<Error> error;
  try {
    embrope::embed(ref::view(table, 0, {c.vocab, d}, {tstride, 1}),
                   ref::view(ids, 0, c.ids_shape, id_strides),
                   ref::view(out, 0, out_shape, out_strides), opt);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::index_out_of_range) throw;
    error = e;
  }

  ref::EmbedSpec spec;
  spec.table = &table;
  spec.vocab = c.vocab;
  spec.dim = d;
  spec.table_stride = tstride;
  spec.scale = static_cast<double>(static_cast<float>(c.scale));
  spec.vocab_start = c.vocab_start;
  spec.vocab_shard = c.shard;
  spec.positions = c.positions;
  spec.position_table = &pos_table;
  spec.max_positions = c.max_positions;
  spec.position_stride = pstride;
  spec.base = c.base;
  spec.split = c.split;
  spec.type_table = c.num_types > 0 ? &type_table : nullptr;
  spec.num_types = c.num_types;
  spec.type_stride = d;

  ref::Mismatches m;
  std::vector<double> want, mag;
  std::vector<char> mask(static_cast<std::size_t>(out.size()), 0);
  for (std::int64_t n = 0; n < n_rows; ++n) {
    const std::int64_t id = id_of(n);
    const std::int64_t p = positions[static_cast<std::size_t>(n)];
    const std::int64_t ty = types[static_cast<std::size_t>(n)];
    const bool good = ref::embed_row(spec, id, p, ty, want, mag);
    const double row_norm = ref::norm(want);
    for (std::int64_t e = 0; e < d; ++e) {
      const std::int64_t at = n * ostride + e;
      mask[static_cast<std::size_t>(at)] = 1;
      const auto ue = static_cast<std::size_t>(e);
      m.expect_close(
          [&] {
            return ref::where("out", {n, e}) + " id " + std::to_string(id) + " position " +
                   std::to_string(p) + " type " + std::to_string(ty) + (good ? "" : " (bad row)");
          },
          out.get(at), want[ue], good ? ref::tolerance(c.dtype, want[ue], row_norm, mag[ue]) : 0.0);
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(m.checked == n_rows * d);
  std::int64_t written_padding = 0;
  for (std::int64_t i = 0; i < out.size(); ++i) {
    if (mask[static_cast<std::size_t>(i)] == 0 &&
        out.bits(i) != out_before[static_cast<std::size_t>(i)]) {
      ++written_padding;
    }
  }
  CHECK(written_padding == 0);
  return error;
}

void run_ok(const EmbedCase& c) {
  const std::optional<Error> e = run_embed(c);
  if (e) FAIL_CHECK("unexpected error: " << e->what() << " in case " << describe(c));
}

std::int64_t case_seed(std::initializer_list<std::int64_t> parts) {
  return static_cast<std::int64_t>(ref::seed_of(parts));
}

}  // namespace

// ------------------------------------------------------------------- lookups ------------

TEST_CASE("embed looks up token rows for each table dtype, id dtype and id shape", "[embed]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType id_dtype = GENERATE(DType::int32, DType::int64);
  const std::vector<std::int64_t> shape =
      GENERATE(std::vector<std::int64_t>{11}, std::vector<std::int64_t>{3, 5},
               std::vector<std::int64_t>{2, 3, 4}, std::vector<std::int64_t>{});
  EmbedCase c;
  c.dtype = dtype;
  c.id_dtype = id_dtype;
  c.ids_shape = shape;
  c.dim = 96;
  c.seed = case_seed({static_cast<int>(dtype), static_cast<int>(id_dtype),
                      static_cast<std::int64_t>(shape.size()), 1});
  run_ok(c);
}

TEST_CASE("embed with strided ids, a padded table and a padded out", "[embed][strided]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  EmbedCase c;
  c.dtype = dtype;
  c.ids_shape = {4, 6};
  c.dim = 40;
  c.table_pad = 3;
  c.out_pad = 5;
  SECTION("every id 3 elements apart") {
    c.id_stride = 3;
    c.seed = case_seed({static_cast<int>(dtype), 2});
    run_ok(c);
  }
  SECTION("ids of a transposed [S, B] buffer viewed as [B, S]") {
    c.ids_strides = {1, 4};
    c.id_dtype = DType::int32;
    c.seed = case_seed({static_cast<int>(dtype), 3});
    run_ok(c);
  }
  SECTION("one id broadcast over a row with stride 0") {
    c.ids_strides = {1, 0};
    c.seed = case_seed({static_cast<int>(dtype), 4});
    run_ok(c);
  }
}

TEST_CASE("embed multiplies by scale and offsets ids by vocab_start", "[embed]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  EmbedCase c;
  c.dtype = dtype;
  c.dim = 64;
  c.ids_shape = {2, 9};
  c.scale = 8.0;  // sqrt(D)
  c.seed = case_seed({static_cast<int>(dtype), 5});
  run_ok(c);
  SECTION("a non-power-of-two scale and vocab_start 1000") {
    c.scale = std::sqrt(40.0);
    c.vocab_start = 1000;
    c.seed += 1;
    run_ok(c);
  }
}

TEST_CASE("embed over vocab shards: the sum of the shard outputs equals the full lookup",
          "[embed][shard][property]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType id_dtype = GENERATE(DType::int32, DType::int64);
  const std::int64_t v = 40, d = 32, n = 60;
  ref::Buffer table(dtype, v * d), ids(id_dtype, n), full(dtype, n * d);
  ref::fill_random(table, case_seed({static_cast<int>(dtype), 6}));
  ref::fill_random_indices(ids, case_seed({static_cast<int>(id_dtype), 7}), 0, v - 1);
  ref::poison(full);
  EmbedOptions full_opt;
  full_opt.scale = 2.0f;
  embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}), ref::view(full, 0, {n, d}),
                 full_opt);
  const std::int64_t bounds[] = {0, 13, 27, 40};
  std::vector<double> sum(static_cast<std::size_t>(n * d), 0.0);
  std::int64_t wrong = 0;
  for (int s = 0; s < 3; ++s) {
    const std::int64_t start = bounds[s], size = bounds[s + 1] - bounds[s];
    ref::Buffer out(dtype, n * d);
    ref::poison(out);
    EmbedOptions opt;
    opt.scale = 2.0f;
    opt.vocab_start = start;
    opt.vocab_shard = true;
    // The shard's table is a view of its rows of the full table.
    embrope::embed(ref::view(table, start * d, {size, d}), ref::view(ids, 0, {n}),
                   ref::view(out, 0, {n, d}), opt);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t id = ids.get_index(i);
      const bool hit = id >= start && id < start + size;
      for (std::int64_t e = 0; e < d; ++e) {
        const double got = out.get(i * d + e);
        // A hit is the exact scaled row (scaling by 2 is exact), a miss exactly zero.
        const double want = hit ? 2.0 * table.get(id * d + e) : 0.0;
        if (!(got == want)) ++wrong;
        sum[static_cast<std::size_t>(i * d + e)] += got;
      }
    }
  }
  CHECK(wrong == 0);
  std::int64_t sum_wrong = 0;
  for (std::int64_t i = 0; i < n * d; ++i) {
    if (!(sum[static_cast<std::size_t>(i)] == full.get(i))) ++sum_wrong;
  }
  CHECK(sum_wrong == 0);
}

TEST_CASE("embed over a shard still adds positions and types to rows whose id misses",
          "[embed][shard]") {
  const DType dtype = GENERATE(DType::float32, DType::bfloat16);
  EmbedCase c;
  c.dtype = dtype;
  c.ids_shape = {3, 8};
  c.dim = 48;
  c.vocab = 20;
  c.vocab_start = 20;
  c.shard = true;  // ids drawn from [10, 50): about half miss
  c.positions = Positions::learned;
  c.num_types = 2;
  c.seed = case_seed({static_cast<int>(dtype), 8});
  run_ok(c);
}

// -------------------------------------------------------------- positions ---------------

TEST_CASE("embed adds learned positions from explicit position_ids", "[embed][learned]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType position_dtype = GENERATE(DType::int32, DType::int64);
  const std::vector<std::int64_t> shape =
      GENERATE(std::vector<std::int64_t>{13}, std::vector<std::int64_t>{2, 3, 2},
               std::vector<std::int64_t>{});
  EmbedCase c;
  c.dtype = dtype;
  c.position_dtype = position_dtype;
  c.ids_shape = shape;
  c.positions = Positions::learned;
  c.max_positions = 64;
  c.dim = 80;
  c.seed = case_seed({static_cast<int>(dtype), static_cast<int>(position_dtype),
                      static_cast<std::int64_t>(shape.size()), 9});
  run_ok(c);
}

TEST_CASE("embed adds learned positions offset_b + s for [B, S] ids", "[embed][learned]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType position_dtype = GENERATE(DType::int32, DType::int64);
  EmbedCase c;
  c.dtype = dtype;
  c.position_dtype = position_dtype;
  c.ids_shape = {3, 5};
  c.positions = Positions::learned;
  c.explicit_positions = false;
  c.max_positions = 30;
  c.dim = 32;
  c.seed = case_seed({static_cast<int>(dtype), static_cast<int>(position_dtype), 10});
  SECTION("per-row position_offsets (decoding with a KV cache)") {
    c.with_offsets = true;
    c.offsets = {0, 25, 11};  // row 1 reaches position 29, the last row of the table
    run_ok(c);
  }
  SECTION("no offsets: positions 0..S-1 in every row") {
    run_ok(c);
  }
  SECTION("[S] ids without offsets") {
    c.ids_shape = {30};
    run_ok(c);
  }
}

TEST_CASE("embed adds sinusoidal positions in both layouts up to position 1e6",
          "[embed][sinusoidal]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool split = GENERATE(false, true);
  const double base = GENERATE(10000.0, 500.0);
  EmbedCase c;
  c.dtype = dtype;
  c.split = split;
  c.base = base;
  c.positions = Positions::sinusoidal;
  c.ids_shape = {24};
  c.dim = 64;
  c.max_sinusoid_position = 1000000;
  c.position_ids = {0, 1, 2, 999999, 1000000, (1 << 20) - 1, 131071, 65536, 12345};
  c.seed = case_seed({static_cast<int>(dtype), split, static_cast<std::int64_t>(base), 11});
  run_ok(c);
}

TEST_CASE("embed adds sinusoidal positions at implicit offset_b + s", "[embed][sinusoidal]") {
  const DType dtype = GENERATE(DType::float32, DType::bfloat16);
  EmbedCase c;
  c.dtype = dtype;
  c.positions = Positions::sinusoidal;
  c.explicit_positions = false;
  c.with_offsets = true;
  c.ids_shape = {2, 6};
  c.dim = 16;
  c.max_sinusoid_position = 500000;
  c.seed = case_seed({static_cast<int>(dtype), 12});
  run_ok(c);
}

TEST_CASE("the sinusoid reference follows the paper (self-check of the test's oracle)",
          "[embed][reference]") {
  // P(0) = [0, 1, 0, 1, ...] interleaved; P(p)[0] = sin(p) since w_0 = 1.
  const std::vector<double> p0 = ref::sinusoid(0, 8, 10000.0, false);
  CHECK(p0 == std::vector<double>{0, 1, 0, 1, 0, 1, 0, 1});
  const std::vector<double> p5 = ref::sinusoid(5, 8, 10000.0, true);
  CHECK(p5[0] == std::sin(5.0));
  CHECK(p5[4] == std::cos(5.0));
  CHECK(p5[1] == std::sin(5.0 / std::pow(10000.0, 2.0 / 8.0)));
}

// The float32 sinusoid rows of embed at the given positions: a zero scale makes each output
// element 0 * token + P(p)[j] = P(p)[j], the op's own sinusoid. T: the output dtype (the
// table is ones).
template <typename T>
std::vector<T> embed_sinusoid_rows(const std::vector<std::int64_t>& positions, std::int64_t dim,
                                   SinusoidLayout layout, float scale = 0.0f,
                                   const std::vector<T>* table = nullptr) {
  const auto n = static_cast<std::int64_t>(positions.size());
  const DType dtype = std::is_same_v<T, float> ? DType::float32 : DType::bfloat16;
  std::vector<T> ones(static_cast<std::size_t>(dim), embrope::detail::from_float<T>(1.0f));
  if (table == nullptr) table = &ones;
  const std::int64_t vocab = static_cast<std::int64_t>(table->size()) / dim;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) ids[static_cast<std::size_t>(r)] = (r * 7) % vocab;
  std::vector<T> out(static_cast<std::size_t>(n * dim));
  EmbedOptions o;
  o.scale = scale;
  o.positions = PositionEncoding::sinusoidal;
  o.sinusoid_layout = layout;
  o.position_ids = Tensor(const_cast<std::int64_t*>(positions.data()), DType::int64, {n});
  embrope::embed(Tensor(const_cast<T*>(table->data()), dtype, {vocab, dim}),
                 Tensor(ids.data(), DType::int64, {n}), Tensor(out.data(), dtype, {n, dim}), o);
  return out;
}

TEST_CASE("sinusoids are within 4 float32 ulps of 1 of float64 sin/cos below 2^32",
          "[embed][sinusoidal][numerics]") {
  // docs/numerics.md: the float32 angle addition of float32-rounded sin/cos of the anchor's and
  // the offset's angles: four roundings of factors, three of products and sum, and
  // |sin a cos b| + |cos a sin b| <= 1, so at most 4 * 2^-24; plus the float64 angle: a w +
  // b w, each product rounded, against the reference's rounded p w, 2^-51 p w at most.
  const bool split = GENERATE(false, true);
  const std::int64_t dim = 512;
  std::vector<std::int64_t> positions;
  for (std::int64_t p = 0; p < 40; ++p) positions.push_back(p);
  for (std::int64_t p = 999990; p < 1000030; ++p) positions.push_back(p);
  std::uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>(state >> 32);  // [0, 2^32)
  };
  for (int k = 0; k < 200; ++k) positions.push_back(next() % (std::int64_t{1} << 20));
  for (int k = 0; k < 60; ++k) positions.push_back(next());
  positions.push_back((std::int64_t{1} << 32) - 1);
  const SinusoidLayout layout = split ? SinusoidLayout::split : SinusoidLayout::interleaved;
  const std::vector<float> out = embed_sinusoid_rows<float>(positions, dim, layout);
  double worst_small = 0.0;  // over positions below 2^20
  ref::Mismatches m;
  for (std::size_t r = 0; r < positions.size(); ++r) {
    const std::int64_t p = positions[r];
    const std::vector<double> want = ref::sinusoid(p, dim, 10000.0, split);
    for (std::int64_t j = 0; j < dim; ++j) {
      const std::int64_t i = split ? j % (dim / 2) : j / 2;
      const double angle = static_cast<double>(p) * ref::sinusoid_freq(i, dim, 10000.0);
      const double got = out[r * dim + static_cast<std::size_t>(j)];
      const double error = std::fabs(got - want[static_cast<std::size_t>(j)]);
      if (p < (1 << 20)) worst_small = std::max(worst_small, error);
      m.expect_close([&] { return "P(" + std::to_string(p) + ")[" + std::to_string(j) + "]"; }, got,
                     want[static_cast<std::size_t>(j)],
                     std::ldexp(4.0, -24) + std::ldexp(angle, -51));
    }
  }
  INFO(m.first << "largest error below position 2^20: " << worst_small);
  CHECK(m.count == 0);
  CHECK(m.checked == static_cast<std::int64_t>(positions.size()) * dim);
}

TEST_CASE("a position's sinusoids do not depend on the call's other rows", "[embed][sinusoidal]") {
  // The CPU reuses a thread's anchor row across consecutive positions and its offset rows
  // across the call: each row must equal that position's row computed alone.
  const bool split = GENERATE(false, true);
  const bool bf16 = GENERATE(false, true);
  const std::int64_t dim = GENERATE(512, 76);
  const SinusoidLayout layout = split ? SinusoidLayout::split : SinusoidLayout::interleaved;
  std::vector<std::int64_t> positions;
  for (std::int64_t p = 5; p < 305; ++p) positions.push_back(p);                // consecutive
  for (std::int64_t p = 400; p > 100; --p) positions.push_back(p);              // decreasing
  for (int k = 0; k < 100; ++k) positions.push_back(77777);                     // repeated
  for (std::int64_t k = 0; k < 200; ++k) positions.push_back(1000000 + 7 * k);  // strided
  for (std::int64_t k = 0; k < 200; ++k) positions.push_back((k * 2654435761ll) % 4294967296ll);
  INFO("D " << dim << (split ? " split" : " interleaved") << (bf16 ? " bfloat16" : " float32"));
  const auto check = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> table(static_cast<std::size_t>(13 * dim));
    for (std::size_t k = 0; k < table.size(); ++k) {
      table[k] = embrope::detail::from_float<T>(static_cast<float>(std::sin(0.37 * k)));
    }
    const std::vector<T> all = embed_sinusoid_rows<T>(positions, dim, layout, 1.0f, &table);
    std::int64_t differing = 0;
    for (std::size_t r = 0; r < positions.size(); ++r) {
      // Alone, with the token row it had in the call (id (r * 7) % 13).
      std::vector<T> own(table.begin() + static_cast<std::ptrdiff_t>(((r * 7) % 13) * dim),
                         table.begin() + static_cast<std::ptrdiff_t>(((r * 7) % 13 + 1) * dim));
      const std::vector<T> alone = embed_sinusoid_rows<T>({positions[r]}, dim, layout, 1.0f, &own);
      if (std::memcmp(alone.data(), all.data() + r * dim, sizeof(T) * dim) != 0) ++differing;
    }
    CHECK(differing == 0);
  };
  if (bf16) {
    check(embrope::detail::BFloat16{0});
  } else {
    check(0.0f);
  }
}

TEST_CASE("sinusoidal positions at and past 2^32 are bad positions",
          "[embed][sinusoidal][errors][bad_index]") {
  EmbedCase c;
  c.ids_shape = {4};
  c.dim = 16;
  c.positions = Positions::sinusoidal;
  c.position_ids = {3, (std::int64_t{1} << 32) - 1, std::int64_t{1} << 32, 1};
  const std::optional<Error> e = run_embed(c);  // rows checked against the reference
  REQUIRE(e.has_value());
  INFO("message: " << e->what());
  CHECK(e->code() == ErrorCode::index_out_of_range);
  CHECK_THAT(e->what(), Catch::Contains("position_ids[2]") && Catch::Contains("4294967296") &&
                            Catch::Contains("[0, 4294967296)"));
}

TEST_CASE("embed adds token-type rows", "[embed][types]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType id_dtype = GENERATE(DType::int32, DType::int64);
  EmbedCase c;
  c.dtype = dtype;
  c.id_dtype = id_dtype;
  c.ids_shape = {4, 4};
  c.dim = 24;
  c.num_types = 3;
  c.seed = case_seed({static_cast<int>(dtype), static_cast<int>(id_dtype), 13});
  run_ok(c);
}

TEST_CASE("embed fuses scale, vocab_start, learned positions with offsets and token types",
          "[embed][fused]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool sinusoidal = GENERATE(false, true);
  EmbedCase c;
  c.dtype = dtype;
  c.ids_shape = {3, 7};
  c.dim = 128;
  c.vocab = 37;
  c.vocab_start = 500;
  c.scale = std::sqrt(128.0);
  c.positions = sinusoidal ? Positions::sinusoidal : Positions::learned;
  c.explicit_positions = false;
  c.with_offsets = true;
  c.max_positions = 50;
  c.num_types = 2;
  c.out_pad = 8;
  c.table_pad = 1;
  c.id_stride = 2;
  c.seed = case_seed({static_cast<int>(dtype), sinusoidal, 14});
  run_ok(c);
}

TEST_CASE(
    "embed on a prefill-sized call (the threaded path) matches the reference and "
    "reports the first bad id",
    "[embed][threaded]") {
  const DType dtype = GENERATE(DType::float32, DType::float16);
  EmbedCase c;
  c.dtype = dtype;
  c.ids_shape = {700};  // 700 rows x 64: well past any serial cut-off
  c.dim = 64;
  c.vocab = 300;
  c.positions = Positions::learned;
  c.max_positions = 700;
  c.explicit_positions = false;
  c.num_types = 2;
  c.seed = case_seed({static_cast<int>(dtype), 31});
  SECTION("all ids valid") {
    run_ok(c);
  }
  SECTION("bad ids at rows 699 and 450") {
    c.ids.resize(700);
    for (std::size_t i = 0; i < c.ids.size(); ++i) {
      c.ids[i] = static_cast<std::int64_t>(i * 7 % 300);
    }
    c.ids[699] = 300;
    c.ids[450] = -9;
    const std::optional<Error> e = run_embed(c);
    REQUIRE(e.has_value());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("ids[450]") && Catch::Contains("-9"));
  }
}

// ------------------------------------------------------------------ bad indices ----------

TEST_CASE(
    "embed with an id outside the vocabulary zero-fills its row and reports "
    "ids[index] and the value",
    "[embed][errors][bad_index]") {
  struct Bad {
    DType id_dtype;
    std::int64_t value;
  };
  const Bad bad =
      GENERATE(Bad{DType::int64, -1}, Bad{DType::int64, 50 + 100}, Bad{DType::int64, 99},
               Bad{DType::int64, INT64_MAX}, Bad{DType::int64, INT64_MIN},
               Bad{DType::int32, INT32_MAX}, Bad{DType::int32, 0});
  const DType dtype = GENERATE(DType::float32, DType::float16);
  EmbedCase c;
  c.dtype = dtype;
  c.id_dtype = bad.id_dtype;
  c.vocab_start = 100;  // valid ids [100, 150): 99, 150, 0 and -1 are all outside
  c.ids_shape = {2, 4};
  c.dim = 16;
  c.positions = Positions::learned;
  c.ids = {100, 149, 120, 101, 130, bad.value, 110, 111};
  c.seed = case_seed({bad.value, static_cast<int>(dtype), 15});
  const std::optional<Error> e = run_embed(c);
  REQUIRE(e.has_value());
  INFO("message: " << e->what());
  CHECK(e->code() == ErrorCode::index_out_of_range);
  CHECK_THAT(e->what(), Catch::Contains("embed"));
  CHECK_THAT(e->what(), Catch::Contains("ids[5]"));  // flat row-major index into ids
  CHECK_THAT(e->what(), Catch::Contains(std::to_string(bad.value)));
}

TEST_CASE("embed reports the first of several bad rows and zero-fills all of them",
          "[embed][errors][bad_index]") {
  EmbedCase c;
  c.ids_shape = {6};
  c.dim = 8;
  c.vocab = 10;
  c.ids = {1, 2, 10, 3, -4, 9};
  const std::optional<Error> e = run_embed(c);
  REQUIRE(e.has_value());
  CHECK(e->code() == ErrorCode::index_out_of_range);
  CHECK_THAT(e->what(), Catch::Contains("ids[2]") && Catch::Contains("10"));
}

TEST_CASE("embed with a position outside the learned table zero-fills its row",
          "[embed][errors][bad_index]") {
  EmbedCase c;
  c.ids_shape = {2, 4};
  c.dim = 16;
  c.positions = Positions::learned;
  c.max_positions = 12;
  SECTION("explicit position_ids: position_ids[index] and the value") {
    const std::int64_t value = GENERATE(as<std::int64_t>{}, 12, -1, std::int64_t{1} << 33);
    c.position_ids = {0, 11, 3, 4, 5, 6, value, 7};
    c.seed = case_seed({value, 16});
    const std::optional<Error> e = run_embed(c);
    REQUIRE(e.has_value());
    INFO("message: " << e->what());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("embed") && Catch::Contains("position_ids[6]") &&
                              Catch::Contains(std::to_string(value)));
  }
  SECTION("implicit offset_b + s past the table") {
    c.explicit_positions = false;
    c.with_offsets = true;
    c.offsets = {0, 9};  // row 1: positions 9, 10, 11, 12 -> flat row 7 is bad
    const std::optional<Error> e = run_embed(c);
    REQUIRE(e.has_value());
    INFO("message: " << e->what());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("embed") && Catch::Contains("12"));
  }
  SECTION("an offset near INT64_MAX does not wrap around into the table") {
    c.explicit_positions = false;
    c.with_offsets = true;
    c.offsets = {0, INT64_MAX - 1};  // row 1: INT64_MAX - 1 + s overflows int64 for s >= 2
    const std::optional<Error> e = run_embed(c);
    REQUIRE(e.has_value());
    INFO("message: " << e->what());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("ids[4]"));  // flat row 4 is (b 1, s 0)
  }
  SECTION("a negative position offset") {
    c.explicit_positions = false;
    c.with_offsets = true;
    c.offsets = {-2, 0};  // row 0: positions -2, -1 bad; 0, 1 good
    const std::optional<Error> e = run_embed(c);
    REQUIRE(e.has_value());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("-2"));
  }
}

TEST_CASE("embed with a negative sinusoidal position zero-fills its row",
          "[embed][errors][bad_index]") {
  EmbedCase c;
  c.ids_shape = {5};
  c.dim = 16;
  c.positions = Positions::sinusoidal;
  c.position_ids = {3, 0, -1, 4, 1000000};
  const std::optional<Error> e = run_embed(c);
  REQUIRE(e.has_value());
  INFO("message: " << e->what());
  CHECK(e->code() == ErrorCode::index_out_of_range);
  CHECK_THAT(e->what(), Catch::Contains("position_ids[2]") && Catch::Contains("-1"));
}

TEST_CASE("embed with a type id outside the type table zero-fills its row",
          "[embed][errors][bad_index]") {
  const std::int64_t value = GENERATE(2, -1);
  EmbedCase c;
  c.ids_shape = {4};
  c.dim = 16;
  c.num_types = 2;
  c.type_ids = {0, 1, 1, value};
  c.seed = case_seed({value, 17});
  const std::optional<Error> e = run_embed(c);
  REQUIRE(e.has_value());
  INFO("message: " << e->what());
  CHECK(e->code() == ErrorCode::index_out_of_range);
  CHECK_THAT(e->what(), Catch::Contains("type_ids[3]") && Catch::Contains(std::to_string(value)));
}

TEST_CASE("embed with a DeferredStatus returns normally and reports at check()",
          "[embed][errors][deferred]") {
  DeferredStatus status;
  EmbedCase c;
  c.ids_shape = {5};
  c.dim = 8;
  c.vocab = 10;
  SECTION("good ids leave the status clean") {
    c.ids = {0, 9, 1, 2, 3};
    CHECK_FALSE(run_embed(c, &status).has_value());
    CHECK(status.ok());
  }
  SECTION("a bad id is recorded; check() throws once and clears") {
    c.ids = {0, 9, 1, 12, 3};
    CHECK_FALSE(run_embed(c, &status).has_value());  // rows checked, row 3 zero
    CHECK_FALSE(status.ok());
    try {
      status.check();
      FAIL("check() did not throw");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::index_out_of_range);
      CHECK_THAT(e.what(),
                 Catch::Contains("embed") && Catch::Contains("ids[3]") && Catch::Contains("12"));
    }
    CHECK(status.ok());
    CHECK_NOTHROW(status.check());
  }
}

// ------------------------------------------------------------------ argument errors ------

namespace {

// A valid embed call that each error test breaks in one way.
struct EmbedFixture {
  static constexpr std::int64_t v = 10, d = 8, b = 2, s = 3, n = b * s, p = 16;
  ref::Buffer table{DType::float32, v* d};
  ref::Buffer ids{DType::int64, n};
  ref::Buffer out{DType::float32, n* d};
  ref::Buffer pos_table{DType::float32, p* d};
  ref::Buffer pos_ids{DType::int64, n};
  ref::Buffer offsets{DType::int64, b};
  ref::Buffer type_table{DType::float32, 2 * d};
  ref::Buffer type_ids{DType::int64, n};
  std::vector<std::uint64_t> out_before;

  EmbedFixture() {
    ref::fill_random(table, 201);
    ref::fill_random_indices(ids, 202, 0, v - 1);
    ref::poison(out);
    out_before = out.snapshot();
    ref::fill_random(pos_table, 203);
    ref::fill_random_indices(pos_ids, 204, 0, p - 1);
    ref::fill_random_indices(offsets, 205, 0, 3);
    ref::fill_random(type_table, 206);
    ref::fill_random_indices(type_ids, 207, 0, 1);
  }
  Tensor table_t() { return ref::view(table, 0, {v, d}); }
  Tensor ids_t() { return ref::view(ids, 0, {b, s}); }
  Tensor out_t() { return ref::view(out, 0, {b, s, d}); }
  EmbedOptions learned() {
    EmbedOptions o;
    o.positions = PositionEncoding::learned;
    o.position_table = ref::view(pos_table, 0, {p, d});
    return o;
  }
  bool out_untouched() const { return out.snapshot() == out_before; }
};

constexpr std::initializer_list<ErrorCode> kInvalid = {ErrorCode::invalid_argument};

}  // namespace

TEST_CASE("embed error fixture is a valid call (positive control)", "[embed][errors]") {
  EmbedFixture f;
  CHECK_NOTHROW(embrope::embed(f.table_t(), f.ids_t(), f.out_t()));
  EmbedOptions o = f.learned();
  o.position_offsets = ref::view(f.offsets, 0, {2});
  o.type_table = ref::view(f.type_table, 0, {2, 8});
  o.type_ids = ref::view(f.type_ids, 0, {2, 3});
  CHECK_NOTHROW(embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o));
}

TEST_CASE("embed rejects a vocab_start whose shard end overflows int64", "[embed][errors]") {
  EmbedFixture f;
  EmbedOptions o;
  o.vocab_start = INT64_MAX - 1;
  o.vocab_shard = true;
  try {
    embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("embed: vocab_start") && Catch::Contains("overflows"));
  }
  CHECK(f.out_untouched());
}

TEST_CASE("embed rejects wrong dtypes with a message naming the argument", "[embed][errors]") {
  EmbedFixture f;
  SECTION("ids given as float32") {
    ref::Buffer idf(DType::float32, f.n);
    ref::fill_random(idf, 1);
    expect_error(
        [&] {
          embrope::embed(f.table_t(), ref::view(idf, 0, {2, 3}), f.out_t());
        },
        kInvalid, {"embed", "ids"});
  }
  SECTION("table of dtype int32") {
    ref::Buffer ti(DType::int32, f.table.size());
    ref::Buffer oi(DType::int32, f.out.size());
    expect_error(
        [&] {
          embrope::embed(ref::view(ti, 0, {10, 8}), f.ids_t(), ref::view(oi, 0, {2, 3, 8}));
        },
        kInvalid, {"embed", "table"});
  }
  SECTION("out float16 with a float32 table") {
    ref::Buffer oh(DType::float16, f.out.size());
    ref::poison(oh);
    const auto before = oh.snapshot();
    expect_error(
        [&] {
          embrope::embed(f.table_t(), f.ids_t(), ref::view(oh, 0, {2, 3, 8}));
        },
        kInvalid, {"embed", "out"});
    CHECK(oh.snapshot() == before);
  }
  SECTION("position_table bfloat16 with a float32 table") {
    ref::Buffer pt(DType::bfloat16, f.pos_table.size());
    ref::fill_random(pt, 2);
    EmbedOptions o = f.learned();
    o.position_table = ref::view(pt, 0, {16, 8});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_table"});
  }
  SECTION("type_table float16 with a float32 table") {
    ref::Buffer tt(DType::float16, f.type_table.size());
    ref::fill_random(tt, 3);
    EmbedOptions o;
    o.type_table = ref::view(tt, 0, {2, 8});
    o.type_ids = ref::view(f.type_ids, 0, {2, 3});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "type_table"});
  }
  SECTION("position_ids given as float32") {
    ref::Buffer pf(DType::float32, f.n);
    ref::fill_random(pf, 4);
    EmbedOptions o = f.learned();
    o.position_ids = ref::view(pf, 0, {2, 3});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_ids"});
  }
  SECTION("type_ids given as float32") {
    ref::Buffer tf(DType::float32, f.n);
    ref::fill_random(tf, 5);
    EmbedOptions o;
    o.type_table = ref::view(f.type_table, 0, {2, 8});
    o.type_ids = ref::view(tf, 0, {2, 3});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "type_ids"});
  }
  CHECK(f.out_untouched());
}

TEST_CASE("embed rejects shapes that disagree", "[embed][errors]") {
  EmbedFixture f;
  SECTION("out with D + 1 columns") {
    ref::Buffer o(DType::float32, 6 * 9);
    expect_error(
        [&] {
          embrope::embed(f.table_t(), f.ids_t(), ref::view(o, 0, {2, 3, 9}));
        },
        kInvalid, {"embed", "out"});
  }
  SECTION("out with another number of rows") {
    expect_error(
        [&] {
          embrope::embed(f.table_t(), f.ids_t(), ref::view(f.out, 0, {2, 2, 8}));
        },
        kInvalid, {"embed", "out"});
  }
  SECTION("out flattened to [N, D] for [B, S] ids") {
    expect_error(
        [&] {
          embrope::embed(f.table_t(), f.ids_t(), ref::view(f.out, 0, {6, 8}));
        },
        kInvalid, {"embed", "out"});
  }
  SECTION("table of rank 1 or 3") {
    expect_error([&] { embrope::embed(ref::view(f.table, 0, {80}), f.ids_t(), f.out_t()); },
                 kInvalid, {"embed", "table"});
    expect_error(
        [&] {
          embrope::embed(ref::view(f.table, 0, {2, 5, 8}), f.ids_t(), f.out_t());
        },
        kInvalid, {"embed", "table"});
  }
  SECTION("position_table with another D") {
    EmbedOptions o = f.learned();
    o.position_table = ref::view(f.pos_table, 0, {32, 4});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_table"});
  }
  SECTION("type_table with another D") {
    EmbedOptions o;
    o.type_table = ref::view(f.type_table, 0, {4, 4});
    o.type_ids = ref::view(f.type_ids, 0, {2, 3});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "type_table"});
  }
  SECTION("position_ids of another shape than ids") {
    EmbedOptions o = f.learned();
    o.position_ids = ref::view(f.pos_ids, 0, {3, 2});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_ids"});
  }
  SECTION("type_ids of another shape than ids") {
    EmbedOptions o;
    o.type_table = ref::view(f.type_table, 0, {2, 8});
    o.type_ids = ref::view(f.type_ids, 0, {6});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "type_ids"});
  }
  SECTION("position_offsets of another length than B") {
    EmbedOptions o = f.learned();
    o.position_offsets = ref::view(f.offsets, 0, {1});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_offsets"});
  }
  CHECK(f.out_untouched());
}

TEST_CASE("embed rejects bad position and type options", "[embed][errors]") {
  EmbedFixture f;
  SECTION("sinusoidal positions with an odd D") {
    ref::Buffer t7(DType::float32, 10 * 7), o7(DType::float32, 6 * 7);
    ref::fill_random(t7, 6);
    EmbedOptions o;
    o.positions = PositionEncoding::sinusoidal;
    expect_error(
        [&] {
          embrope::embed(ref::view(t7, 0, {10, 7}), f.ids_t(), ref::view(o7, 0, {2, 3, 7}), o);
        },
        kInvalid, {"embed", "7"});
  }
  SECTION("sinusoidal positions with base 0, negative, below 1 or NaN") {
    const double base = GENERATE(0.0, -1.0, 0.5, std::nan(""));
    EmbedOptions o;
    o.positions = PositionEncoding::sinusoidal;
    o.sinusoid_base = base;
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "sinusoid_base"});
  }
  SECTION("positions and sinusoid_layout outside their enumerators") {
    // A uint8_t enum holds any byte: positions 9 with a table was taken as none (the table
    // silently left out), sinusoid_layout 5 as interleaved.
    EmbedOptions o = f.learned();
    o.positions = static_cast<PositionEncoding>(9);
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "positions 9", "PositionEncoding"});
    o = EmbedOptions{};
    o.positions = PositionEncoding::sinusoidal;
    o.sinusoid_layout = static_cast<embrope::SinusoidLayout>(5);
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "sinusoid_layout 5", "SinusoidLayout"});
    CHECK(f.out_untouched());
  }
  SECTION("learned positions without a position_table") {
    EmbedOptions o;
    o.positions = PositionEncoding::learned;
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_table"});
  }
  SECTION("position_ids together with position_offsets") {
    EmbedOptions o = f.learned();
    o.position_ids = ref::view(f.pos_ids, 0, {2, 3});
    o.position_offsets = ref::view(f.offsets, 0, {2});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_offsets"});
  }
  SECTION("implicit positions with 3-D ids") {
    EmbedOptions o = f.learned();
    expect_error(
        [&] {
          embrope::embed(f.table_t(), ref::view(f.ids, 0, {1, 2, 3}),
                         ref::view(f.out, 0, {1, 2, 3, 8}), o);
        },
        kInvalid, {"embed"});
  }
  SECTION("a type table without type ids") {
    EmbedOptions o;
    o.type_table = ref::view(f.type_table, 0, {2, 8});
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "type_ids"});
  }
  CHECK(f.out_untouched());
}

TEST_CASE("embed rejects a last dimension with a stride other than 1, and null data",
          "[embed][errors]") {
  EmbedFixture f;
  SECTION("table") {
    expect_error(
        [&] {
          embrope::embed(ref::view(f.table, 0, {5, 4}, {16, 2}), f.ids_t(),
                         ref::view(f.out, 0, {2, 3, 4}));
        },
        kInvalid, {"embed", "table", "stride"});
  }
  SECTION("out") {
    ref::Buffer o(DType::float32, 2 * f.out.size());
    expect_error(
        [&] {
          embrope::embed(f.table_t(), f.ids_t(), ref::view(o, 0, {2, 3, 8}, {48, 16, 2}));
        },
        kInvalid, {"embed", "out", "stride"});
  }
  SECTION("position_table") {
    EmbedOptions o = f.learned();
    o.position_table = ref::view(f.pos_table, 0, {8, 8}, {16, 2});
    o.position_ids = ref::view(f.pos_ids, 0, {2, 3});
    for (std::int64_t i = 0; i < f.n; ++i) f.pos_ids.set_index(i, i);
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, kInvalid,
                 {"embed", "position_table", "stride"});
  }
  SECTION("null table data") {
    expect_error(
        [&] {
          embrope::embed(Tensor(nullptr, DType::float32, {10, 8}), f.ids_t(), f.out_t());
        },
        kInvalid, {"embed", "table"});
  }
  SECTION("null ids data") {
    expect_error(
        [&] {
          embrope::embed(f.table_t(), Tensor(nullptr, DType::int64, {2, 3}), f.out_t());
        },
        kInvalid, {"embed", "ids"});
  }
  SECTION("null out data") {
    expect_error(
        [&] {
          embrope::embed(f.table_t(), f.ids_t(), Tensor(nullptr, DType::float32, {2, 3, 8}));
        },
        kInvalid, {"embed", "out"});
  }
  CHECK(f.out_untouched());
}

TEST_CASE("embed rejects tensors on a CUDA device it cannot use, naming the op",
          "[embed][errors][device]") {
  EmbedFixture f;
  const std::int64_t ts[] = {10, 8}, is[] = {2, 3}, os[] = {2, 3, 8};
  const std::initializer_list<ErrorCode> codes = {ErrorCode::invalid_argument,
                                                  ErrorCode::not_implemented};
  const Tensor ids_cuda(f.ids.data(), DType::int64, 2, is, nullptr, Device::cuda(0));
  const Tensor table_cuda(f.table.data(), DType::float32, 2, ts, nullptr, Device::cuda(0));
  const Tensor out_cuda(f.out.data(), DType::float32, 3, os, nullptr, Device::cuda(0));
  SECTION("ids on cuda:0, table and out on the CPU") {
    expect_error([&] { embrope::embed(f.table_t(), ids_cuda, f.out_t()); }, codes,
                 {"embed", "ids"});
  }
  SECTION("out on cuda:0") {
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), out_cuda); }, codes,
                 {"embed", "out"});
  }
  SECTION("a position table on cuda:0") {
    EmbedOptions o = f.learned();
    o.position_table = Tensor(f.pos_table.data(), DType::float32, 2, ts, nullptr, Device::cuda(0));
    expect_error([&] { embrope::embed(f.table_t(), f.ids_t(), f.out_t(), o); }, codes,
                 {"embed", "position_table"});
  }
  SECTION("every tensor on cuda:0 without a GPU") {
    if (embrope::cuda_device_count() > 0) {
      WARN("a GPU is present: the all-CUDA no-GPU path is not exercised");
      return;
    }
    expect_error([&] { embrope::embed(table_cuda, ids_cuda, out_cuda); },
                 {ErrorCode::not_implemented}, {"embed", "cuda"});
  }
  CHECK(f.out_untouched());
}
