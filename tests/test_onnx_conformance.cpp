// ONNX RotaryEmbedding (opset 23) conformance vectors from shared/conformance/
// (docs/architecture.md), run through apply_rope with caller cos/sin tables, through both the C++
// API and the C API. The folder comes from the compile definition EMBROPE_CONFORMANCE_DIR; a
// missing folder or vector is a failure, never a silent pass.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "reference.hpp"

#ifndef EMBROPE_CONFORMANCE_DIR
#define EMBROPE_CONFORMANCE_DIR ""  // makes every test here fail: the build must set it
#endif

namespace {

using embrope::DType;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::Tensor;

namespace fs = std::filesystem;

const char* const kVectors[] = {
    "test_rotary_embedding",
    "test_rotary_embedding_3d_input",
    "test_rotary_embedding_interleaved",
    "test_rotary_embedding_no_position_ids",
    "test_rotary_embedding_no_position_ids_interleaved",
    "test_rotary_embedding_no_position_ids_rotary_dim",
    "test_rotary_embedding_with_interleaved_rotary_dim",
    "test_rotary_embedding_with_rotary_dim",
};

struct OnnxTensor {
  std::vector<std::int64_t> dims;
  std::vector<double> values;
};

struct OnnxVector {
  std::string name;
  bool interleaved = false;
  std::int64_t num_heads = 0;
  std::int64_t rotary_dim_attr = 0;
  OnnxTensor input, cos, sin, output;
  std::optional<OnnxTensor> position_ids;
};

OnnxTensor read_tensor(const nlohmann::json& j) {
  OnnxTensor t;
  t.dims = j.at("dims").get<std::vector<std::int64_t>>();
  t.values = j.at("values").get<std::vector<double>>();
  std::int64_t n = 1;
  for (std::int64_t d : t.dims) n *= d;
  REQUIRE(static_cast<std::int64_t>(t.values.size()) == n);
  return t;
}

fs::path conformance_dir() {
  return fs::path(EMBROPE_CONFORMANCE_DIR);
}

OnnxVector load(const std::string& name) {
  const fs::path path = conformance_dir() / (name + ".json");
  INFO("vector file " << path.string());
  REQUIRE(fs::is_regular_file(path));
  std::ifstream in(path);
  REQUIRE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  OnnxVector v;
  v.name = j.at("test").get<std::string>();
  REQUIRE(v.name == name);
  REQUIRE(j.at("nodes").size() == 1);
  const nlohmann::json& node = j.at("nodes")[0];
  REQUIRE(node.at("op_type").get<std::string>() == "RotaryEmbedding");
  const nlohmann::json& attrs = node.at("attrs");
  v.interleaved = attrs.value("interleaved", 0) != 0;
  v.num_heads = attrs.value("num_heads", std::int64_t{0});
  v.rotary_dim_attr = attrs.value("rotary_embedding_dim", std::int64_t{0});
  bool have_input = false, have_cos = false, have_sin = false;
  for (const nlohmann::json& t : j.at("inputs")) {
    const std::string n = t.at("name").get<std::string>();
    if (n == "input") {
      v.input = read_tensor(t);
      have_input = true;
    } else if (n == "cos_cache") {
      v.cos = read_tensor(t);
      have_cos = true;
    } else if (n == "sin_cache") {
      v.sin = read_tensor(t);
      have_sin = true;
    } else if (n == "position_ids") {
      v.position_ids = read_tensor(t);
    }
  }
  REQUIRE((have_input && have_cos && have_sin));
  REQUIRE(j.at("outputs").size() == 1);
  v.output = read_tensor(j.at("outputs")[0]);
  REQUIRE(v.output.dims == v.input.dims);
  return v;
}

// The vector as embrope views: [B, S, H, D] strides into the ONNX input layout, the
// [rows, R/2] cos/sin tables and [B, S] positions.
struct Mapped {
  std::int64_t b = 0, s = 0, h = 0, d = 0, r = 0, rows = 0;
  std::vector<std::int64_t> x_shape, x_strides;  // [B, S, H, D] over the ONNX memory
  std::vector<std::int64_t> table_shape;         // [rows, R/2]
  ref::Buffer input, cos, sin, positions, expected;
};

Mapped map(const OnnxVector& v) {
  Mapped m;
  if (v.input.dims.size() == 4) {  // [B, H, S, D] viewed as [B, S, H, D]
    m.b = v.input.dims[0];
    m.h = v.input.dims[1];
    m.s = v.input.dims[2];
    m.d = v.input.dims[3];
    m.x_strides = {m.h * m.s * m.d, m.d, m.s * m.d, 1};
  } else {  // [B, S, H * D] with num_heads
    REQUIRE(v.input.dims.size() == 3);
    REQUIRE(v.num_heads > 0);
    m.b = v.input.dims[0];
    m.s = v.input.dims[1];
    m.h = v.num_heads;
    m.d = v.input.dims[2] / m.h;
    m.x_strides = {m.s * m.h * m.d, m.h * m.d, m.d, 1};
  }
  m.x_shape = {m.b, m.s, m.h, m.d};
  m.r = v.rotary_dim_attr != 0 ? v.rotary_dim_attr : m.d;
  REQUIRE(v.cos.dims.back() == m.r / 2);
  REQUIRE(v.sin.dims == v.cos.dims);
  if (v.position_ids) {  // caches [max_pos, R/2] indexed by position
    REQUIRE(v.cos.dims.size() == 2);
    m.rows = v.cos.dims[0];
  } else {  // caches [B, S, R/2]: a [B*S, R/2] table indexed by b*S + s
    REQUIRE(v.cos.dims.size() == 3);
    REQUIRE(v.cos.dims[0] == m.b);
    REQUIRE(v.cos.dims[1] == m.s);
    m.rows = m.b * m.s;
  }
  m.table_shape = {m.rows, m.r / 2};
  auto to_buffer = [](const std::vector<double>& values, DType dtype) {
    ref::Buffer buf(dtype, static_cast<std::int64_t>(values.size()));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::int64) {
        buf.set_index(static_cast<std::int64_t>(i), static_cast<std::int64_t>(values[i]));
      } else {
        // float32 values round-trip exactly through the JSON.
        REQUIRE(static_cast<double>(static_cast<float>(values[i])) == values[i]);
        buf.set(static_cast<std::int64_t>(i), values[i]);
      }
    }
    return buf;
  };
  m.input = to_buffer(v.input.values, DType::float32);
  m.cos = to_buffer(v.cos.values, DType::float32);
  m.sin = to_buffer(v.sin.values, DType::float32);
  m.expected = to_buffer(v.output.values, DType::float32);
  if (v.position_ids) {
    REQUIRE(v.position_ids->dims == std::vector<std::int64_t>{m.b, m.s});
    m.positions = to_buffer(v.position_ids->values, DType::int64);
  } else {
    m.positions = ref::Buffer(DType::int64, m.b * m.s);
    for (std::int64_t i = 0; i < m.b * m.s; ++i) m.positions.set_index(i, i);
  }
  return m;
}

// Every element within 1e-6 absolute + 1e-6 relative of the ONNX output.
void expect_matches(const std::string& name, const ref::Buffer& got, const ref::Buffer& want) {
  ref::Mismatches mm;
  for (std::int64_t i = 0; i < want.size(); ++i) {
    const double w = want.get(i);
    mm.expect_close([&] { return name + " element " + std::to_string(i); }, got.get(i), w,
                    1e-6 + 1e-6 * std::fabs(w));
  }
  INFO(mm.summary());
  CHECK(mm.count == 0);
  CHECK(mm.checked == want.size());
}

struct DL {
  std::vector<std::int64_t> shape, strides;
  DLTensor t{};
  DL(void* data, DLDataType dtype, std::vector<std::int64_t> shape_,
     std::vector<std::int64_t> strides_ = {})
      : shape(std::move(shape_)), strides(std::move(strides_)) {
    t.data = data;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
    t.byte_offset = 0;
  }
};

}  // namespace

TEST_CASE("the ONNX conformance folder holds the eight RotaryEmbedding vectors",
          "[onnx][conformance]") {
  const fs::path dir = conformance_dir();
  INFO("EMBROPE_CONFORMANCE_DIR = \"" << EMBROPE_CONFORMANCE_DIR << "\"");
  REQUIRE_FALSE(dir.empty());
  REQUIRE(fs::is_directory(dir));
  int json_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") ++json_files;
  }
  CHECK(json_files == 8);
  for (const char* name : kVectors) {
    INFO(name);
    CHECK(fs::is_regular_file(dir / (std::string(name) + ".json")));
  }
}

TEST_CASE("ONNX RotaryEmbedding vectors through the C++ apply_rope with caller cos/sin",
          "[onnx][conformance]") {
  const std::string name = GENERATE(from_range(std::begin(kVectors), std::end(kVectors)));
  INFO("vector " << name);
  const OnnxVector v = load(name);
  Mapped m = map(v);
  INFO("B " << m.b << " S " << m.s << " H " << m.h << " D " << m.d << " R " << m.r << " rows "
            << m.rows << (v.interleaved ? " interleaved" : " neox"));
  const Tensor cos_t = ref::view(m.cos, 0, m.table_shape);
  const Tensor sin_t = ref::view(m.sin, 0, m.table_shape);
  const Tensor pos_t = ref::view(m.positions, 0, {m.b, m.s});
  RopeOptions opt;
  opt.layout = v.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  opt.rotary_dim = v.rotary_dim_attr;  // 0 means: take it from the table

  SECTION("out of place into a poisoned output of the input's layout") {
    ref::Buffer out(DType::float32, m.input.size());
    ref::poison(out);
    const ref::Buffer input_before = m.input;
    opt.q_out = ref::view(out, 0, m.x_shape, m.x_strides);
    embrope::apply_rope(ref::view(m.input, 0, m.x_shape, m.x_strides), std::nullopt, pos_t, cos_t,
                        sin_t, opt);
    expect_matches(name, out, m.expected);
    CHECK(m.input.snapshot() == input_before.snapshot());
  }
  SECTION("in place, the input as q and a copy as k") {
    ref::Buffer k = m.input;
    embrope::apply_rope(ref::view(m.input, 0, m.x_shape, m.x_strides),
                        ref::view(k, 0, m.x_shape, m.x_strides), pos_t, cos_t, sin_t, opt);
    expect_matches(name + " (q)", m.input, m.expected);
    expect_matches(name + " (k)", k, m.expected);
  }
}

TEST_CASE("ONNX RotaryEmbedding vectors through the C API embrope_apply_rope_cos_sin",
          "[onnx][conformance][c_api]") {
  const std::string name = GENERATE(from_range(std::begin(kVectors), std::end(kVectors)));
  INFO("vector " << name);
  const OnnxVector v = load(name);
  Mapped m = map(v);
  const DLDataType f32{kDLFloat, 32, 1};
  const DLDataType i64{kDLInt, 64, 1};
  ref::Buffer out(DType::float32, m.input.size());
  ref::poison(out);
  DL x(m.input.data(), f32, m.x_shape, m.x_strides);
  DL o(out.data(), f32, m.x_shape, m.x_strides);
  DL p(m.positions.data(), i64, {m.b, m.s});
  DL c(m.cos.data(), f32, m.table_shape);
  DL s(m.sin.data(), f32, m.table_shape);
  embrope_rope_options_t opt;
  embrope_rope_options_init(&opt);
  opt.layout = v.interleaved ? EMBROPE_ROPE_INTERLEAVED : EMBROPE_ROPE_NEOX;
  opt.rotary_dim = v.rotary_dim_attr;
  opt.q_out = &o.t;
  const embrope_status_t status =
      embrope_apply_rope_cos_sin(&x.t, nullptr, &p.t, &c.t, &s.t, &opt, nullptr);
  INFO("last error: " << embrope_last_error());
  REQUIRE(status == EMBROPE_OK);
  expect_matches(name, out, m.expected);
}
