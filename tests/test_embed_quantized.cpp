// embed from quantized tables (QuantizedTable, docs/ops.md "embed from a quantized table"):
// every format's dequantized rows against references written from the formulas (int8 and int4
// as ExecuTorch and torchao define them, float8 through the tests' own float8 decoder) and, for
// GGUF, the values the gguf package itself dequantized from the blocks (tests/data/gguf); then
// the fused options against the float64 reference of embed and against embed of a float32 table
// holding the same values; then the errors.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "embrope/embrope.hpp"
#include "gguf_vectors.hpp"
#include "reference.hpp"

namespace {

using embrope::DType;
using embrope::EmbedOptions;
using embrope::Error;
using embrope::ErrorCode;
using embrope::QuantFormat;
using embrope::QuantizedTable;
using embrope::Tensor;
using ref::Buffer;

const char* name_of(QuantFormat f) {
  switch (f) {
    case QuantFormat::int8:
      return "int8";
    case QuantFormat::int4:
      return "int4";
    case QuantFormat::float8_e4m3fn:
      return "float8_e4m3fn";
    case QuantFormat::float8_e5m2:
      return "float8_e5m2";
    case QuantFormat::gguf_q8_0:
      return "Q8_0";
    case QuantFormat::gguf_q4_0:
      return "Q4_0";
    case QuantFormat::gguf_q4_k:
      return "Q4_K";
    case QuantFormat::gguf_q6_k:
      return "Q6_K";
  }
  return "?";
}

bool is_gguf(QuantFormat f) {
  return f == QuantFormat::gguf_q8_0 || f == QuantFormat::gguf_q4_0 ||
         f == QuantFormat::gguf_q4_k || f == QuantFormat::gguf_q6_k;
}

float float_of_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// How the scales of an int8, int4 or float8 table are laid out.
enum class Scales { table, row, groups };

struct QuantCase {
  QuantFormat format = QuantFormat::int8;
  std::int64_t dim = 64;   // GGUF: set from the block size
  std::int64_t vocab = 9;  // GGUF: set from the number of blocks
  Scales scales = Scales::row;
  std::int64_t groups = 1;  // Scales::groups: G
  DType scale_dtype = DType::float32;
  std::optional<DType> zero_point_dtype;  // int8 / int4 only
  bool fractional_zero_points = false;    // float zero points off the integers
  std::int64_t row_pad = 3;               // bytes (or elements) after each data row
  std::uint64_t seed = 1;
};

std::string describe(const QuantCase& c) {
  std::ostringstream os;
  os << name_of(c.format) << " V " << c.vocab << " D " << c.dim << " scales "
     << (c.scales == Scales::table ? "per table"
         : c.scales == Scales::row ? "per row"
                                   : "groups ")
     << (c.scales == Scales::groups ? std::to_string(c.groups) : "") << " "
     << embrope::dtype_name(c.scale_dtype) << " zero points "
     << (c.zero_point_dtype ? embrope::dtype_name(*c.zero_point_dtype) : "none")
     << (c.fractional_zero_points ? " fractional" : "") << " pad " << c.row_pad << " seed "
     << c.seed;
  return os.str();
}

// A quantized table and the float32 value of every element, computed here from the format's
// definition (not by the library): values[row * D + j].
struct QuantTableData {
  QuantCase c;
  std::int64_t columns = 0;
  Buffer data, scales, zero_points;
  std::vector<float> values;

  QuantizedTable table() {
    QuantizedTable t;
    t.format = c.format;
    t.dim = c.dim;
    const DType data_dtype = c.format == QuantFormat::int8            ? DType::int8
                             : c.format == QuantFormat::float8_e4m3fn ? DType::float8_e4m3fn
                             : c.format == QuantFormat::float8_e5m2   ? DType::float8_e5m2
                                                                      : DType::uint8;
    REQUIRE(data.dtype() == data_dtype);
    t.data = ref::view(data, 0, {c.vocab, columns}, {columns + c.row_pad, 1});
    if (scales.size() > 0) t.scales = scale_view(scales);
    if (zero_points.size() > 0) t.zero_points = scale_view(zero_points);
    return t;
  }
  Tensor scale_view(Buffer& b) const {
    if (c.scales == Scales::table) return ref::view(b, 0, {});
    if (c.scales == Scales::row) return ref::view(b, 0, {c.vocab});
    return ref::view(b, 0, {c.vocab, c.groups});
  }
};

QuantTableData make_table(QuantCase c) {
  QuantTableData t;
  std::mt19937_64 rng(c.seed);
  if (is_gguf(c.format)) {
    const nlohmann::json& v = gguf_vectors::all()[name_of(c.format)];
    const std::vector<std::uint8_t> bytes = gguf_vectors::from_hex(v["blocks"].get<std::string>());
    const std::vector<std::uint32_t> bits = v["values"].get<std::vector<std::uint32_t>>();
    const std::int64_t block_values =
        c.format == QuantFormat::gguf_q4_k || c.format == QuantFormat::gguf_q6_k ? 256 : 32;
    const std::int64_t blocks = static_cast<std::int64_t>(bits.size()) / block_values;
    const std::int64_t block_bytes = static_cast<std::int64_t>(bytes.size()) / blocks;
    // Two blocks per row where there are enough, so that a row spans blocks.
    const std::int64_t per_row = blocks % 2 == 0 ? 2 : 1;
    c.dim = per_row * block_values;
    c.vocab = blocks / per_row;
    t.columns = per_row * block_bytes;
    t.data = Buffer(DType::uint8, c.vocab * (t.columns + c.row_pad));
    ref::poison(t.data);
    for (std::int64_t r = 0; r < c.vocab; ++r) {
      for (std::int64_t b = 0; b < t.columns; ++b) {
        const std::int64_t at = r * t.columns + b;
        t.data.set_bits(r * (t.columns + c.row_pad) + b, bytes[static_cast<std::size_t>(at)]);
      }
    }
    for (std::uint32_t u : bits) t.values.push_back(float_of_bits(u));
    t.c = c;
    return t;
  }

  const std::int64_t V = c.vocab, D = c.dim;
  const std::int64_t groups = c.scales == Scales::groups ? c.groups : 1;  // per row: one group of D
  const std::int64_t group = D / groups;
  const std::int64_t n_scales = c.scales == Scales::table ? 1 : V * groups;
  auto scale_index = [&](std::int64_t r, std::int64_t j) {
    return c.scales == Scales::table ? 0 : r * groups + j / group;
  };
  t.scales = Buffer(c.scale_dtype, n_scales);
  std::uniform_real_distribution<double> scale_dist(0.002, 0.2);
  for (std::int64_t i = 0; i < n_scales; ++i) t.scales.set(i, scale_dist(rng));
  if (c.zero_point_dtype) {
    t.zero_points = Buffer(*c.zero_point_dtype, n_scales);
    std::uniform_int_distribution<int> zp(-6, 6);
    for (std::int64_t i = 0; i < n_scales; ++i) {
      const double frac = c.fractional_zero_points ? 0.375 : 0.0;
      t.zero_points.set(i, zp(rng) + frac);
    }
  }
  auto scale_of = [&](std::int64_t r, std::int64_t j) {
    return static_cast<float>(t.scales.get(scale_index(r, j)));
  };
  auto zero_of = [&](std::int64_t r, std::int64_t j) {
    return c.zero_point_dtype ? static_cast<float>(t.zero_points.get(scale_index(r, j))) : 0.0f;
  };
  t.values.resize(static_cast<std::size_t>(V * D));
  if (c.format == QuantFormat::int8 || c.format == QuantFormat::int4) {
    const bool int4 = c.format == QuantFormat::int4;
    t.columns = int4 ? D / 2 : D;
    t.data = Buffer(int4 ? DType::uint8 : DType::int8, V * (t.columns + c.row_pad));
    ref::poison(t.data);
    std::uniform_int_distribution<int> q_dist(int4 ? -8 : -128, int4 ? 7 : 127);
    for (std::int64_t r = 0; r < V; ++r) {
      for (std::int64_t j = 0; j < D; ++j) {
        const int q = q_dist(rng);
        const std::int64_t row = r * (t.columns + c.row_pad);
        if (int4) {
          // ExecuTorch's packing: (q[2k] + 8) << 4 | (q[2k + 1] + 8).
          const std::uint64_t old = j % 2 == 0 ? 0 : t.data.bits(row + j / 2);
          const std::uint64_t nib = static_cast<std::uint64_t>(q + 8);
          t.data.set_bits(row + j / 2, j % 2 == 0 ? nib << 4 : old | nib);
        } else {
          t.data.set(row + j, q);
        }
        // (q - zero_point) * scale, each step rounded to float32 (ExecuTorch's order).
        const float diff = static_cast<float>(q) - zero_of(r, j);
        t.values[static_cast<std::size_t>(r * D + j)] = diff * scale_of(r, j);
      }
    }
  } else {  // float8
    const DType f8 =
        c.format == QuantFormat::float8_e4m3fn ? DType::float8_e4m3fn : DType::float8_e5m2;
    t.columns = D;
    t.data = Buffer(f8, V * (D + c.row_pad));
    ref::poison(t.data);
    std::uniform_int_distribution<int> byte(0, 255);
    for (std::int64_t r = 0; r < V; ++r) {
      for (std::int64_t j = 0; j < D; ++j) {
        std::uint8_t code;
        do {
          code = static_cast<std::uint8_t>(byte(rng));
        } while (ref::fp8_is_nan(f8, code) || std::isinf(ref::decode_fp8(f8, code)));
        t.data.set_bits(r * (D + c.row_pad) + j, code);
        t.values[static_cast<std::size_t>(r * D + j)] =
            static_cast<float>(ref::decode_fp8(f8, code)) * scale_of(r, j);
      }
    }
  }
  t.c = c;
  return t;
}

// Every format with a few scale layouts (the GGUF ones from the gguf package's blocks).
std::vector<QuantCase> format_cases() {
  std::vector<QuantCase> cases;
  std::uint64_t seed = 1;
  for (QuantFormat f : {QuantFormat::int8, QuantFormat::int4}) {
    for (Scales s : {Scales::table, Scales::row, Scales::groups}) {
      for (int zp = 0; zp < 4; ++zp) {
        QuantCase c;
        c.format = f;
        c.scales = s;
        c.groups = 4;  // groups of 16 of D 64
        c.seed = seed++;
        c.scale_dtype = zp == 3 ? DType::bfloat16 : zp == 2 ? DType::float16 : DType::float32;
        if (zp == 1) c.zero_point_dtype = DType::int8;
        if (zp == 2) c.zero_point_dtype = DType::float16;
        if (zp == 3) {
          c.zero_point_dtype = DType::float32;
          c.fractional_zero_points = true;
        }
        cases.push_back(c);
      }
    }
    QuantCase odd;  // groups of 3 values: int4 groups that begin and end inside a byte
    odd.format = f;
    odd.dim = 6;
    odd.scales = Scales::groups;
    odd.groups = 2;
    odd.zero_point_dtype = DType::float32;
    odd.seed = seed++;
    cases.push_back(odd);
    QuantCase c32;  // torchao's int32 zero points, groups of 32
    c32.format = f;
    c32.scales = Scales::groups;
    c32.groups = 2;
    c32.zero_point_dtype = DType::int32;
    c32.seed = seed++;
    cases.push_back(c32);
    QuantCase many;  // 100 groups of 20: groups that the 512-value parts split, many a row
    many.format = f;
    many.dim = 2000;
    many.scales = Scales::groups;
    many.groups = 100;
    many.scale_dtype = DType::bfloat16;
    many.zero_point_dtype = DType::int8;
    many.seed = seed++;
    cases.push_back(many);
  }
  for (QuantFormat f : {QuantFormat::float8_e4m3fn, QuantFormat::float8_e5m2}) {
    for (Scales s : {Scales::table, Scales::row}) {
      QuantCase c;
      c.format = f;
      c.scales = s;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (QuantFormat f : {QuantFormat::gguf_q8_0, QuantFormat::gguf_q4_0, QuantFormat::gguf_q4_k,
                        QuantFormat::gguf_q6_k}) {
    QuantCase c;
    c.format = f;
    cases.push_back(c);
  }
  return cases;
}

// Ids that visit every row, in a shuffled order, then some rows again.
std::vector<std::int64_t> shuffled_ids(std::int64_t vocab, std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i % vocab;
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

Buffer id_buffer(const std::vector<std::int64_t>& ids) {
  Buffer b(DType::int64, static_cast<std::int64_t>(ids.size()));
  for (std::size_t i = 0; i < ids.size(); ++i) b.set_index(static_cast<std::int64_t>(i), ids[i]);
  return b;
}

}  // namespace

TEST_CASE("embed from a quantized table gives each format's values bit for bit", "[embed][quant]") {
  for (const QuantCase& c0 : format_cases()) {
    QuantTableData t = make_table(c0);
    const QuantCase& c = t.c;
    INFO(describe(c));
    const std::int64_t n = 2 * c.vocab + 3;
    const std::vector<std::int64_t> ids = shuffled_ids(c.vocab, n, c.seed + 100);
    Buffer id = id_buffer(ids);
    Buffer out(DType::float32, n * c.dim);
    ref::poison(out);
    embrope::embed(t.table(), ref::view(id, 0, {n}), ref::view(out, 0, {n, c.dim}));
    ref::Mismatches m;
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = 0; j < c.dim; ++j) {
        const float want =
            t.values[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)] * c.dim + j)];
        m.expect_bits(
            [&] {
              return ref::where("out", {r, j});
            },
            out.bits(r * c.dim + j), bits_of(want));
      }
    }
    INFO(m.summary());
    CHECK(m.count == 0);
  }
}

TEST_CASE("embed from a quantized table: the fused options as on a float32 table of its values",
          "[embed][quant]") {
  for (const QuantCase& c0 : format_cases()) {
    QuantTableData t = make_table(c0);
    const QuantCase& c = t.c;
    const std::int64_t V = c.vocab, D = c.dim, B = 2, S = 5, n = B * S;
    const std::int64_t P = 12, Y = 3;
    Buffer values(DType::float32, V * D);
    for (std::int64_t i = 0; i < V * D; ++i)
      values.set_bits(i, bits_of(t.values[static_cast<std::size_t>(i)]));
    Buffer id = id_buffer(shuffled_ids(V, n, c.seed + 7));
    Buffer types(DType::int64, n), positions(DType::int64, n);
    ref::fill_random_indices(types, c.seed + 8, 0, Y - 1);
    ref::fill_random_indices(positions, c.seed + 9, 0, P - 1);
    for (DType out_dtype : {DType::float32, DType::bfloat16, DType::float16}) {
      for (int variant = 0; variant < 3; ++variant) {
        INFO(describe(c) << ", out " << embrope::dtype_name(out_dtype) << ", variant " << variant);
        Buffer pos_table(out_dtype, P * D), type_table(out_dtype, Y * D);
        ref::fill_random(pos_table, c.seed + 10);
        ref::fill_random(type_table, c.seed + 11);
        Buffer weight(DType::float32, D), bias(DType::float32, D);
        ref::fill_random(weight, c.seed + 12);
        ref::fill_random(bias, c.seed + 13);
        EmbedOptions o;
        o.scale = 0.75f;
        if (variant >= 1) {
          o.positions = embrope::PositionEncoding::learned;
          o.position_table = ref::view(pos_table, 0, {P, D});
          o.position_ids = ref::view(positions, 0, {B, S});
          o.type_table = ref::view(type_table, 0, {Y, D});
          o.type_ids = ref::view(types, 0, {B, S});
        }
        if (variant == 2) {
          o.norm = embrope::Normalization::layer_norm;
          o.norm_weight = ref::view(weight, 0, {D});
          o.norm_bias = ref::view(bias, 0, {D});
        }
        Buffer out(out_dtype, n * D);
        ref::poison(out);
        embrope::embed(t.table(), ref::view(id, 0, {B, S}), ref::view(out, 0, {B, S, D}), o);

        if (out_dtype == DType::float32) {
          // The float table's embed of the same values (float32 table, float32 out): the same
          // arithmetic, so the same bits.
          Buffer want(DType::float32, n * D);
          embrope::embed(ref::view(values, 0, {V, D}), ref::view(id, 0, {B, S}),
                         ref::view(want, 0, {B, S, D}), o);
          ref::Mismatches m;
          for (std::int64_t i = 0; i < n * D; ++i) {
            m.expect_bits(
                [&] {
                  return ref::where("out", {i / D, i % D});
                },
                out.bits(i), want.bits(i));
          }
          INFO(m.summary());
          CHECK(m.count == 0);
        }
        if (variant < 2) {  // the float64 reference of embed (the norm has its own tests)
          ref::EmbedSpec spec;
          spec.table = &values;
          spec.vocab = V;
          spec.dim = D;
          spec.table_stride = D;
          spec.scale = o.scale;
          if (variant == 1) {
            spec.positions = ref::Positions::learned;
            spec.position_table = &pos_table;
            spec.max_positions = P;
            spec.position_stride = D;
            spec.type_table = &type_table;
            spec.num_types = Y;
            spec.type_stride = D;
          }
          ref::Mismatches m;
          std::vector<double> want, magnitude;
          for (std::int64_t r = 0; r < n; ++r) {
            REQUIRE(ref::embed_row(spec, id.get_index(r), positions.get_index(r),
                                   types.get_index(r), want, magnitude));
            const double row_norm = ref::norm(want);
            for (std::int64_t j = 0; j < D; ++j) {
              const auto k = static_cast<std::size_t>(j);
              m.expect_close(
                  [&] {
                    return ref::where("out", {r, j});
                  },
                  out.get(r * D + j), want[k],
                  ref::tolerance(out_dtype, want[k], row_norm, magnitude[k]));
            }
          }
          INFO(m.summary());
          CHECK(m.count == 0);
        }
      }
    }
  }
}

TEST_CASE("embed from a quantized table: shards, padding ids and bad ids as the float table's",
          "[embed][quant]") {
  QuantCase c;
  c.format = QuantFormat::int4;
  c.scales = Scales::groups;
  c.groups = 2;
  c.zero_point_dtype = DType::int8;
  QuantTableData t = make_table(c);
  const std::int64_t V = c.vocab, D = c.dim;
  // Shard [100, 100 + V): ids outside give zero token rows.
  const std::vector<std::int64_t> ids = {100, 99, 100 + V - 1, 100 + V, 105, -1};
  Buffer id = id_buffer(ids);
  const auto n = static_cast<std::int64_t>(ids.size());
  Buffer out(DType::float32, n * D);
  ref::poison(out);
  EmbedOptions o;
  o.vocab_start = 100;
  o.vocab_shard = true;
  embrope::embed(t.table(), ref::view(id, 0, {n}), ref::view(out, 0, {n, D}), o);
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t i = ids[static_cast<std::size_t>(r)];
    const bool hit = i >= 100 && i < 100 + V;
    for (std::int64_t j = 0; j < D; ++j) {
      const float want = hit ? t.values[static_cast<std::size_t>((i - 100) * D + j)] : 0.0f;
      INFO("row " << r << " id " << i << " element " << j);
      REQUIRE(out.bits(r * D + j) == bits_of(want));
    }
  }
  // Without a shard, an id past the table is a bad index: an error naming it, or deferred.
  o.vocab_shard = false;
  try {
    embrope::embed(t.table(), ref::view(id, 0, {n}), ref::view(out, 0, {n, D}), o);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::index_out_of_range);
    CHECK(ref::mentions(e.what(), "ids"));
  }
  embrope::DeferredStatus status;
  o.deferred = &status;
  embrope::embed(t.table(), ref::view(id, 0, {n}), ref::view(out, 0, {n, D}), o);
  CHECK_THROWS_AS(status.check(), Error);
}

TEST_CASE("embed from a quantized table refuses what does not match its format", "[embed][quant]") {
  QuantCase c;
  c.format = QuantFormat::int4;
  c.scales = Scales::groups;
  c.groups = 4;
  c.zero_point_dtype = DType::int8;
  QuantTableData t = make_table(c);
  const std::int64_t D = c.dim;
  Buffer id = id_buffer({1, 2});
  Buffer out(DType::bfloat16, 2 * D);
  const Tensor ids = ref::view(id, 0, {2});
  const Tensor outv = ref::view(out, 0, {2, D});
  auto expect_error = [&](const QuantizedTable& table, std::initializer_list<const char*> words,
                          const EmbedOptions& o = {}) {
    try {
      embrope::embed(table, ids, outv, o);
      FAIL("no error");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(ref::mentions(e.what(), "embed"));
      for (const char* w : words) CHECK(std::string(e.what()).find(w) != std::string::npos);
    }
  };
  {  // data columns that do not hold D values of the format
    QuantizedTable bad = t.table();
    bad.dim = D + 2;
    expect_error(bad, {"table.data", "33 bytes", "32 columns"});
    bad.dim = D - 1;
    expect_error(bad, {"D 63", "even"});
  }
  {  // groups that do not divide D
    Buffer scales(DType::float32, c.vocab * 3);
    QuantizedTable bad = t.table();
    bad.scales = ref::view(scales, 0, {c.vocab, 3});
    bad.zero_points.reset();
    expect_error(bad, {"table.scales", "3 columns", "divide D 64"});
  }
  {  // scales of another table
    Buffer scales(DType::float32, 5 * 4);
    QuantizedTable bad = t.table();
    bad.scales = ref::view(scales, 0, {5, 4});
    expect_error(bad, {"table.scales"});
  }
  {  // zero points shaped unlike the scales
    Buffer zp(DType::int8, c.vocab);
    QuantizedTable bad = t.table();
    bad.zero_points = ref::view(zp, 0, {c.vocab});
    expect_error(bad, {"table.zero_points", "shape"});
  }
  {  // zero points of a dtype that cannot hold them
    Buffer zp(DType::int64, c.vocab * 4);
    QuantizedTable bad = t.table();
    bad.zero_points = ref::view(zp, 0, {c.vocab, 4});
    expect_error(bad, {"table.zero_points", "int64"});
  }
  {  // no scales
    QuantizedTable bad = t.table();
    bad.scales.reset();
    bad.zero_points.reset();
    expect_error(bad, {"table.scales"});
  }
  {  // the data's dtype is not the format's
    Buffer data(DType::int8, c.vocab * D / 2);
    QuantizedTable bad = t.table();
    bad.data = ref::view(data, 0, {c.vocab, D / 2});
    expect_error(bad, {"table.data", "int8", "uint8"});
  }
  {  // GGUF: sizes by whole blocks; no scales beside the blocks
    Buffer data(DType::uint8, 2 * 144);
    QuantizedTable q4k;
    q4k.format = QuantFormat::gguf_q4_k;
    q4k.dim = 128;
    q4k.data = ref::view(data, 0, {2, 144});
    expect_error(q4k, {"gguf_q4_k", "multiple of 256"});
    q4k.dim = 256;
    Buffer scales(DType::float32, 2);
    q4k.scales = ref::view(scales, 0, {2});
    expect_error(q4k, {"table.scales", "blocks"});
    q4k.scales.reset();
    q4k.data = ref::view(data, 0, {2, 143});
    expect_error(q4k, {"143 columns", "144 bytes"});
  }
  {  // float8 tables have no zero points
    Buffer data(DType::float8_e4m3fn, c.vocab * D), scales(DType::float32, 1),
        zp(DType::float32, 1);
    QuantizedTable f8;
    f8.format = QuantFormat::float8_e4m3fn;
    f8.dim = D;
    f8.data = ref::view(data, 0, {c.vocab, D});
    f8.scales = ref::view(scales, 0, {});
    f8.zero_points = ref::view(zp, 0, {});
    expect_error(f8, {"zero points"});
  }
  {  // out chooses the value dtype: a position table of another dtype is refused
    Buffer pos(DType::float32, 4 * D), pos_ids(DType::int64, 2);
    EmbedOptions o;
    o.positions = embrope::PositionEncoding::learned;
    o.position_table = ref::view(pos, 0, {4, D});
    o.position_ids = ref::view(pos_ids, 0, {2});
    expect_error(t.table(), {"position_table", "out"}, o);
  }
  {  // out may not be an int8 or uint8 tensor
    Buffer out8(DType::int8, 2 * D);
    try {
      embrope::embed(t.table(), ids, ref::view(out8, 0, {2, D}));
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("out") != std::string::npos);
    }
  }
}

TEST_CASE("embed from a quantized table reads strided scales and zero points by their strides",
          "[embed][quant]") {
  // int8, V 5, D 8, groups of 4: scales [V, 2] at row stride 5 (padding between rows), int8
  // zero points [V, 2] at row stride 7; then scales [V, 1] whose column stride is 9 (one per
  // row, the column never stepped); a [V, 2] view with column stride 2 is refused.
  const std::int64_t V = 5, D = 8, G = 2;
  Buffer data(DType::int8, V * D), scales(DType::float32, V * 5), zps(DType::int8, V * 7);
  std::mt19937_64 rng(3);
  for (std::int64_t i = 0; i < V * D; ++i) data.set(i, static_cast<int>(rng() % 255) - 127);
  for (std::int64_t i = 0; i < V * 5; ++i) scales.set(i, 0.125 * static_cast<double>(1 + i % 7));
  for (std::int64_t i = 0; i < V * 7; ++i) zps.set(i, static_cast<int>(rng() % 9) - 4);
  Buffer id = id_buffer({4, 0, 3, 1, 2});
  Buffer out(DType::float32, V * D);
  QuantizedTable t;
  t.format = QuantFormat::int8;
  t.dim = D;
  t.data = ref::view(data, 0, {V, D});
  t.scales = ref::view(scales, 0, {V, G}, {5, 1});
  t.zero_points = ref::view(zps, 0, {V, G}, {7, 1});
  embrope::embed(t, ref::view(id, 0, {V}), ref::view(out, 0, {V, D}));
  for (std::int64_t n = 0; n < V; ++n) {
    const std::int64_t r = id.get_index(n);
    for (std::int64_t j = 0; j < D; ++j) {
      const auto q = static_cast<float>(data.get(r * D + j));
      const auto z = static_cast<float>(zps.get(r * 7 + j / 4));
      const auto s = static_cast<float>(scales.get(r * 5 + j / 4));
      INFO("row " << n << " element " << j);
      CHECK(out.bits(n * D + j) == bits_of((q - z) * s));
    }
  }
  t.scales = ref::view(scales, 0, {V, 1}, {5, 9});
  t.zero_points.reset();
  embrope::embed(t, ref::view(id, 0, {V}), ref::view(out, 0, {V, D}));
  for (std::int64_t n = 0; n < V; ++n) {
    const std::int64_t r = id.get_index(n);
    for (std::int64_t j = 0; j < D; ++j) {
      INFO("row " << n << " element " << j);
      CHECK(out.bits(n * D + j) == bits_of(static_cast<float>(data.get(r * D + j)) *
                                           static_cast<float>(scales.get(r * 5))));
    }
  }
  t.scales = ref::view(scales, 0, {V, G}, {5, 2});
  CHECK_THROWS_WITH(embrope::embed(t, ref::view(id, 0, {V}), ref::view(out, 0, {V, D})),
                    Catch::Contains("table.scales"));
}
