// The C API (include/embrope/embrope.h, docs/ops.md, docs/errors.md): version, per-thread last
// error, device count, cos/sin cache handles, apply_rope and embed over DLTensors (null strides,
// byte_offset, every dtype) against the float64 reference, and status codes for errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "embrope/version.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DType;

// A DLTensor over a ref::Buffer that owns its shape and strides. `offset` elements are
// passed through byte_offset (the data pointer stays at the buffer's start).
struct DL {
  std::vector<std::int64_t> shape, strides;
  DLTensor t{};
  DL(ref::Buffer& buf, std::vector<std::int64_t> shape_, std::vector<std::int64_t> strides_ = {},
     std::int64_t offset = 0)
      : shape(std::move(shape_)), strides(std::move(strides_)) {
    t.data = buf.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dl_dtype(buf.dtype());
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
    t.byte_offset = static_cast<std::uint64_t>(offset * embrope::dtype_size(buf.dtype()));
  }
};

std::string last_error() {
  return embrope_last_error();
}

}  // namespace

// ------------------------------------------------------------------ basics ---------------

TEST_CASE("embrope_version is the library's MAJOR.MINOR.PATCH", "[c_api]") {
  const char* v = embrope_version();
  REQUIRE(v != nullptr);
  CHECK(std::string(v) == EMBROPE_VERSION_STRING);
  CHECK(std::string(v) == std::to_string(EMBROPE_VERSION_MAJOR) + "." +
                              std::to_string(EMBROPE_VERSION_MINOR) + "." +
                              std::to_string(EMBROPE_VERSION_PATCH));
}

TEST_CASE("the C++ API lives in the inline namespace of the ABI version", "[c_api][abi]") {
  // Code names embrope::X; binaries record embrope::v<EMBROPE_ABI_VERSION>::X, so a program
  // built against another ABI fails to link (docs/abi.md).
  static_assert(EMBROPE_ABI_VERSION == 1, "the ABI version this test's names spell");
  static_assert(std::is_same_v<embrope::Tensor, embrope::v1::Tensor>);
  static_assert(std::is_same_v<embrope::RopeCache, embrope::v1::RopeCache>);
  // The mangled names carry it (Itanium ABI: N7embrope2v1...E).
  CHECK(std::string(typeid(embrope::Tensor).name()) == "N7embrope2v16TensorE");
  CHECK(std::string(typeid(embrope::RopeOptions).name()) == "N7embrope2v111RopeOptionsE");
  using RopeFn =
      void (*)(const embrope::Tensor&, const std::optional<embrope::Tensor>&,
               const embrope::Tensor&, const embrope::RopeCache&, const embrope::RopeOptions&);
  CHECK(static_cast<RopeFn>(embrope::apply_rope) == static_cast<RopeFn>(embrope::v1::apply_rope));
}

TEST_CASE("embrope_last_error is empty on a fresh thread and names the failed function",
          "[c_api][errors]") {
  std::string fresh, after_failure, other_thread;
  embrope_status_t status = EMBROPE_OK;
  std::thread t([&] {
    fresh = embrope_last_error();
    status = embrope_apply_rope(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    after_failure = embrope_last_error();
  });
  t.join();
  CHECK(fresh.empty());
  CHECK(status == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_FALSE(after_failure.empty());
  CHECK_THAT(after_failure, Catch::Contains("apply_rope"));
  // The message belongs to that thread only.
  std::thread u([&] { other_thread = embrope_last_error(); });
  u.join();
  CHECK(other_thread.empty());
  CHECK(embrope_last_error() != nullptr);
}

TEST_CASE("embrope_cuda_device_count agrees with the C++ API and is never negative", "[c_api]") {
  const int n = embrope_cuda_device_count();
  CHECK(n >= 0);
  CHECK(n == embrope::cuda_device_count());
}

TEST_CASE("the options init functions set the documented defaults", "[c_api]") {
  embrope_rope_config_t config;
  std::memset(&config, 0x5a, sizeof config);
  embrope_rope_config_init(&config);
  CHECK(config.rotary_dim == 0);
  CHECK(config.base == 10000.0);
  CHECK(config.max_positions == 0);
  CHECK(config.scaling == EMBROPE_ROPE_SCALING_NONE);
  CHECK(config.factor == 1.0);
  CHECK(config.original_max_positions == 0);
  CHECK(config.sequence_length == 0);
  CHECK(config.beta_fast == 32.0);
  CHECK(config.beta_slow == 1.0);
  CHECK(config.truncate == 1);
  CHECK(config.mscale == 0.0);
  CHECK(config.mscale_all_dim == 0.0);
  CHECK(config.low_freq_factor == 1.0);
  CHECK(config.high_freq_factor == 4.0);
  CHECK(config.short_factor == nullptr);
  CHECK(config.long_factor == nullptr);
  CHECK(config.num_factors == 0);
  CHECK(config.attention_factor == 0.0);

  embrope_rope_options_t ro;
  std::memset(&ro, 0x5a, sizeof ro);
  embrope_rope_options_init(&ro);
  CHECK(ro.layout == EMBROPE_ROPE_NEOX);
  CHECK(ro.inverse == 0);
  CHECK(ro.rotary_dim == 0);
  CHECK(ro.q_out == nullptr);
  CHECK(ro.k_out == nullptr);
  CHECK(ro.mrope_section[0] == 0);
  CHECK(ro.mrope_section[1] == 0);
  CHECK(ro.mrope_section[2] == 0);
  CHECK(ro.deferred == nullptr);
  CHECK(ro.mrope_interleaved == 0);

  embrope_embed_options_t eo;
  std::memset(&eo, 0x5a, sizeof eo);
  embrope_embed_options_init(&eo);
  CHECK(eo.scale == 1.0f);
  CHECK(eo.vocab_start == 0);
  CHECK(eo.vocab_shard == 0);
  CHECK(eo.positions == EMBROPE_POSITIONS_NONE);
  CHECK(eo.position_table == nullptr);
  CHECK(eo.sinusoid_base == 10000.0);
  CHECK(eo.sinusoid_layout == EMBROPE_SINUSOID_INTERLEAVED);
  CHECK(eo.position_ids == nullptr);
  CHECK(eo.position_offsets == nullptr);
  CHECK(eo.type_table == nullptr);
  CHECK(eo.type_ids == nullptr);
  CHECK(eo.deferred == nullptr);
  CHECK(eo.norm == EMBROPE_NORM_NONE);
  CHECK(eo.norm_weight == nullptr);
  CHECK(eo.norm_bias == nullptr);
  CHECK(eo.norm_eps == 1e-5f);
  CHECK(eo.norm_unit_offset == 0);
  CHECK(eo.pre_norm_out == nullptr);
}

// ------------------------------------------------------------------ caches ---------------

TEST_CASE("C cos/sin cache: create, info, copy_to_host, destroy", "[c_api][rope_cache]") {
  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = 24;
  config.base = 50000.0;
  config.max_positions = 77;
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
  REQUIRE(cache != nullptr);

  embrope_rope_config_t info;  // written by the library, up to its struct_size
  embrope_rope_config_init(&info);
  DLDevice device{kDLCUDA, 7};
  CHECK(embrope_rope_cache_info(cache, &info, &device) == EMBROPE_OK);
  CHECK(info.rotary_dim == 24);
  CHECK(info.base == 50000.0);
  CHECK(info.max_positions == 77);
  CHECK(device.device_type == kDLCPU);

  const std::size_t n = 77 * 12;
  std::vector<float> c(n, std::numeric_limits<float>::quiet_NaN()), s(c);
  CHECK(embrope_rope_cache_copy_to_host(cache, c.data(), s.data()) == EMBROPE_OK);
  std::int64_t wrong = 0;
  for (std::int64_t p = 0; p < 77; ++p) {
    for (std::int64_t i = 0; i < 12; ++i) {
      const double angle = static_cast<double>(p) * ref::rope_inv_freq(i, 24, 50000.0);
      const auto k = static_cast<std::size_t>(p * 12 + i);
      const float want_c = static_cast<float>(std::cos(angle));
      const float want_s = static_cast<float>(std::sin(angle));
      // The float32 rounding of the float64 value, within one float32 ulp.
      if (!(std::fabs(c[k] - want_c) <= ref::ulp(ref::kFloat32, want_c))) ++wrong;
      if (!(std::fabs(s[k] - want_s) <= ref::ulp(ref::kFloat32, want_s))) ++wrong;
    }
  }
  CHECK(wrong == 0);
  CHECK(embrope_rope_cache_destroy(cache) == EMBROPE_OK);
  CHECK(embrope_rope_cache_destroy(nullptr) == EMBROPE_OK);
}

TEST_CASE("C cos/sin cache creation errors", "[c_api][rope_cache][errors]") {
  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = 64;
  config.max_positions = 16;
  embrope_rope_cache_t* cache = nullptr;
  SECTION("odd rotary_dim") {
    config.rotary_dim = 63;
    CHECK(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("rotary_dim") && Catch::Contains("63"));
  }
  SECTION("default config (rotary_dim 0)") {
    embrope_rope_config_init(&config);
    CHECK(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("rotary_dim"));
  }
  SECTION("base NaN") {
    config.base = std::numeric_limits<double>::quiet_NaN();
    CHECK(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("base"));
  }
  SECTION("null config and null result pointer") {
    CHECK(embrope_rope_cache_create(nullptr, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_FALSE(last_error().empty());
    CHECK(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_FALSE(last_error().empty());
  }
  SECTION("a CUDA device without a GPU") {
    if (embrope_cuda_device_count() > 0) {
      WARN("a GPU is present: the no-GPU error path is not exercised");
      return;
    }
    CHECK(embrope_rope_cache_create(&config, DLDevice{kDLCUDA, 0}, nullptr, &cache) ==
          EMBROPE_ERROR_NOT_IMPLEMENTED);
    CHECK_FALSE(last_error().empty());
  }
  SECTION("info and copy_to_host of a null cache") {
    embrope_rope_config_t info;
    embrope_rope_config_init(&info);
    DLDevice device;
    CHECK(embrope_rope_cache_info(nullptr, &info, &device) == EMBROPE_ERROR_INVALID_ARGUMENT);
    float c = 0, s = 0;
    CHECK(embrope_rope_cache_copy_to_host(nullptr, &c, &s) == EMBROPE_ERROR_INVALID_ARGUMENT);
  }
  // A failed create leaves no cache behind (nothing to destroy, or a null handle).
  CHECK(embrope_rope_cache_destroy(cache) == EMBROPE_OK);
}

// ------------------------------------------------------------------ RoPE -----------------

namespace {

struct CCache {
  embrope_rope_cache_t* handle = nullptr;
  CCache(std::int64_t rotary_dim, double base, std::int64_t max_positions) {
    embrope_rope_config_t config;
    embrope_rope_config_init(&config);
    config.rotary_dim = rotary_dim;
    config.base = base;
    config.max_positions = max_positions;
    REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &handle) ==
            EMBROPE_OK);
  }
  ~CCache() { embrope_rope_cache_destroy(handle); }
  CCache(const CCache&) = delete;
  CCache& operator=(const CCache&) = delete;
};

// Checks `got` rows [T, H, D] (contiguous from element `offset`) against the reference
// rotation of `before` rows at the given positions.
void check_rope_rows(const ref::Buffer& got, std::int64_t got_offset, const ref::Buffer& before,
                     std::int64_t before_offset, const ref::Buffer& pos, std::int64_t t,
                     std::int64_t h, std::int64_t d, std::int64_t r, bool interleaved,
                     bool inverse) {
  ref::Mismatches m;
  std::vector<double> x(static_cast<std::size_t>(d)), mag;
  for (std::int64_t n = 0; n < t * h; ++n) {
    for (std::int64_t e = 0; e < d; ++e) {
      x[static_cast<std::size_t>(e)] = before.get(before_offset + n * d + e);
    }
    const std::int64_t p = pos.get_index(n / h);
    const std::vector<double> y = ref::rope(x, p, r, 10000.0, interleaved, inverse, &mag);
    const double norm = ref::norm(y);
    for (std::int64_t e = 0; e < d; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      m.expect_close(
          [&] {
            return ref::where("row", {n, e});
          },
          got.get(got_offset + n * d + e), y[ue],
          ref::tolerance(got.dtype(), y[ue], norm, mag[ue]));
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

}  // namespace

TEST_CASE("embrope_apply_rope on DLTensors matches the float64 reference", "[c_api][rope]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType pos_dtype = GENERATE(DType::int32, DType::int64);
  INFO("dtype " << embrope::dtype_name(dtype) << " positions " << embrope::dtype_name(pos_dtype));
  const std::int64_t t = 5, hq = 4, hk = 2, d = 64, r = 64, n = 512;
  const CCache cache(r, 10000.0, n);
  const std::uint64_t seed =
      ref::seed_of({static_cast<int>(dtype), static_cast<int>(pos_dtype), 1});

  SECTION("contiguous (null strides), in place, default options") {
    ref::Buffer q(dtype, t * hq * d), k(dtype, t * hk * d), pos(pos_dtype, t);
    ref::fill_random(q, seed);
    ref::fill_random(k, seed + 1);
    ref::fill_random_indices(pos, seed + 2, 0, n - 1);
    const ref::Buffer q0 = q, k0 = k;
    DL qd(q, {t, hq, d}), kd(k, {t, hk, d}), pd(pos, {t});
    REQUIRE(embrope_apply_rope(&qd.t, &kd.t, &pd.t, cache.handle, nullptr, nullptr) == EMBROPE_OK);
    check_rope_rows(q, 0, q0, 0, pos, t, hq, d, r, false, false);
    check_rope_rows(k, 0, k0, 0, pos, t, hk, d, r, false, false);
  }
  SECTION("byte_offset honoured, explicit strides, interleaved, out of place, no k") {
    const std::int64_t skip = 24;  // elements before the data (48 or 96 bytes)
    ref::Buffer q(dtype, skip + t * hq * d), out(dtype, skip + t * hq * d);
    ref::Buffer pos(pos_dtype, 3 + t);
    ref::fill_random(q, seed + 3);
    ref::poison(out);
    ref::fill_random_indices(pos, seed + 4, 0, n - 1);
    const ref::Buffer q0 = q;
    DL qd(q, {t, hq, d}, {hq * d, d, 1}, skip), od(out, {t, hq, d}, {}, skip);
    DL pd(pos, {t}, {1}, 3);
    embrope_rope_options_t opt;
    embrope_rope_options_init(&opt);
    opt.layout = EMBROPE_ROPE_INTERLEAVED;
    opt.q_out = &od.t;
    REQUIRE(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, &opt, nullptr) == EMBROPE_OK);
    // Positions are read from element 3 on.
    ref::Buffer pos_used(pos_dtype, t);
    for (std::int64_t i = 0; i < t; ++i) pos_used.set_index(i, pos.get_index(3 + i));
    check_rope_rows(out, skip, q0, skip, pos_used, t, hq, d, r, true, false);
    CHECK(q.snapshot() == q0.snapshot());  // out of place: q untouched
    std::int64_t head_written = 0;
    for (std::int64_t i = 0; i < skip; ++i)
      head_written += out.bits(i) != ref::kPoison16 && out.bits(i) != 0x7fc00badu ? 1 : 0;
    CHECK(head_written == 0);  // nothing before byte_offset was written
  }
  SECTION("inverse") {
    ref::Buffer q(dtype, t * hq * d), pos(pos_dtype, t);
    ref::fill_random(q, seed + 5);
    ref::fill_random_indices(pos, seed + 6, 0, n - 1);
    const ref::Buffer q0 = q;
    DL qd(q, {1, t, hq, d}), pd(pos, {1, t});
    embrope_rope_options_t opt;
    embrope_rope_options_init(&opt);
    opt.inverse = 1;
    REQUIRE(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, &opt, nullptr) == EMBROPE_OK);
    check_rope_rows(q, 0, q0, 0, pos, t, hq, d, r, false, true);
  }
}

TEST_CASE("embrope_apply_rope status codes and messages", "[c_api][rope][errors]") {
  const std::int64_t t = 3, h = 2, d = 32;
  const CCache cache(d, 10000.0, 8);
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, t);
  ref::fill_random(q, 11);
  for (std::int64_t i = 0; i < t; ++i) pos.set_index(i, i);
  DL qd(q, {t, h, d}), pd(pos, {t});
  const ref::Buffer q0 = q;
  {  // positive control on a copy
    ref::Buffer q_ctrl = q;
    DL cd(q_ctrl, {t, h, d});
    REQUIRE(embrope_apply_rope(&cd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
            EMBROPE_OK);
  }

  SECTION("null q") {
    CHECK(embrope_apply_rope(nullptr, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope") && Catch::Contains("q"));
  }
  SECTION("null positions") {
    CHECK(embrope_apply_rope(&qd.t, nullptr, nullptr, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope") && Catch::Contains("positions"));
  }
  SECTION("null cache") {
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, nullptr, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope") && Catch::Contains("cache"));
  }
  SECTION("lanes 2") {
    qd.t.dtype.lanes = 2;
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope") && Catch::Contains("lanes"));
  }
  SECTION("float64 q") {
    qd.t.dtype = DLDataType{kDLFloat, 64, 1};
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    // What q accepts, not every dtype the library reads.
    CHECK_THAT(last_error(), Catch::Contains("embrope_apply_rope: q has dtype float64") &&
                                 Catch::Contains("it must be float32, float16 or bfloat16 with") &&
                                 !Catch::Contains("int32"));
  }
  SECTION("uint64 positions") {
    pd.t.dtype = DLDataType{kDLUInt, 64, 1};
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("positions has dtype uint64") &&
                                 Catch::Contains("it must be int32 or int64 with one lane"));
  }
  SECTION("kDLCUDAHost memory") {
    qd.t.device = DLDevice{kDLCUDAHost, 0};
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope"));
  }
  SECTION("kDLCUDA q with a CPU cache and positions") {
    qd.t.device = DLDevice{kDLCUDA, 0};
    const embrope_status_t st =
        embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr);
    CHECK((st == EMBROPE_ERROR_INVALID_ARGUMENT || st == EMBROPE_ERROR_NOT_IMPLEMENTED));
    CHECK_THAT(last_error(), Catch::Contains("apply_rope"));
  }
  SECTION("kDLCUDA q and positions without a GPU") {
    if (embrope_cuda_device_count() > 0) {
      WARN("a GPU is present: the no-GPU error path is not exercised");
      return;
    }
    qd.t.device = DLDevice{kDLCUDA, 0};
    pd.t.device = DLDevice{kDLCUDA, 0};
    const embrope_status_t st =
        embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr);
    CHECK((st == EMBROPE_ERROR_INVALID_ARGUMENT || st == EMBROPE_ERROR_NOT_IMPLEMENTED));
    CHECK_THAT(last_error(), Catch::Contains("apply_rope"));
  }
  SECTION("rotary_dim option mismatch") {
    embrope_rope_options_t opt;
    embrope_rope_options_init(&opt);
    opt.rotary_dim = 16;
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, &opt, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope") && Catch::Contains("rotary_dim"));
  }
  SECTION("a position outside the cache: INDEX_OUT_OF_RANGE, the row zero-filled") {
    pos.set_index(1, 8);
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
    CHECK_THAT(last_error(), Catch::Contains("apply_rope") && Catch::Contains("positions[1]") &&
                                 Catch::Contains("8"));
    std::int64_t nonzero = 0;
    for (std::int64_t i = h * d; i < 2 * h * d; ++i) nonzero += q.get(i) != 0.0 ? 1 : 0;
    CHECK(nonzero == 0);
    // Tokens 0 and 2 are rotated as usual (compare rows of those tokens only).
    ref::Buffer q_tok(DType::float32, h * d), q0_tok(DType::float32, h * d);
    for (std::int64_t tok : {0, 2}) {
      for (std::int64_t i = 0; i < h * d; ++i) {
        q_tok.set(i, q.get(tok * h * d + i));
        q0_tok.set(i, q0.get(tok * h * d + i));
      }
      ref::Buffer p1(DType::int64, 1);
      p1.set_index(0, tok);
      check_rope_rows(q_tok, 0, q0_tok, 0, p1, 1, h, d, d, false, false);
    }
  }
}

// ------------------------------------------------------------------ embed ----------------

TEST_CASE("embrope_embed_quantized reads an int4 table with group scales and zero points",
          "[c_api][embed][quant]") {
  // Two rows of D 4 packed as ExecuTorch packs them (q = [-4, -4, -1, -2] -> 0x44, 0x76; row 1
  // q = [-8, 0, 0, 7]), scales and int8 zero points per group of 2.
  ref::Buffer data(DType::uint8, 4), scales(DType::float32, 4), zps(DType::int8, 4);
  const std::uint8_t bytes[] = {0x44, 0x76, 0x08, 0x8f};
  const double scale[] = {0.5, 0.25, 2.0, 0.125}, zp[] = {1, -2, 0, 3};
  for (int i = 0; i < 4; ++i) {
    data.set_bits(i, bytes[i]);
    scales.set(i, scale[i]);
    zps.set(i, zp[i]);
  }
  ref::Buffer ids(DType::int64, 3), out(DType::float32, 3 * 4);
  const std::int64_t id[] = {1, 0, 1};
  for (int i = 0; i < 3; ++i) ids.set_index(i, id[i]);
  ref::poison(out);
  DL dd(data, {2, 2}), sd(scales, {2, 2}), zd(zps, {2, 2}), idd(ids, {3}), od(out, {3, 4});
  embrope_embed_options_t opt;
  embrope_embed_options_init(&opt);
  opt.scale = 2.0f;
  embrope_quantized_table_t table;
  embrope_quantized_table_init(&table);
  CHECK(table.format == EMBROPE_QUANT_INT8);
  CHECK(table.data == nullptr);
  table.format = EMBROPE_QUANT_INT4;
  table.data = &dd.t;
  table.dim = 4;
  table.scales = &sd.t;
  table.zero_points = &zd.t;
  REQUIRE(embrope_embed_quantized(&table, &idd.t, &od.t, &opt, nullptr) == EMBROPE_OK);
  const double q[2][4] = {{-4, -4, -1, -2}, {-8, 0, 0, 7}};
  for (int r = 0; r < 3; ++r) {
    for (int j = 0; j < 4; ++j) {
      const std::int64_t row = id[r], g = row * 2 + j / 2;
      INFO("row " << r << " element " << j);
      CHECK(out.get(r * 4 + j) == 2.0 * (q[row][j] - zp[g]) * scale[g]);
    }
  }
  // A format that is not one (its bits written as a C caller may), GGUF with scales, no table:
  // errors naming the function and the rule.
  embrope_quantized_table_t bad = table;
  const int not_a_format = 9;
  std::memcpy(&bad.format, &not_a_format, sizeof not_a_format);
  CHECK(embrope_embed_quantized(&bad, &idd.t, &od.t, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(embrope_last_error(), "embrope_embed_quantized"));
  CHECK(std::string(embrope_last_error()).find("embrope_quant_format_t") != std::string::npos);
  // A Q8_0 table of D 32 (one 34-byte block per row) given scales: refused by that rule.
  ref::Buffer q8(DType::uint8, 2 * 34);
  DL q8d(q8, {2, 34});
  bad = table;
  bad.format = EMBROPE_QUANT_GGUF_Q8_0;
  bad.data = &q8d.t;
  bad.dim = 32;
  bad.zero_points = nullptr;
  ref::Buffer out32(DType::float32, 3 * 32);
  DL od32(out32, {3, 32});
  CHECK(embrope_embed_quantized(&bad, &idd.t, &od32.t, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(embrope_last_error()).find("keeps its scales in its blocks") !=
        std::string::npos);
  CHECK(embrope_embed_quantized(nullptr, &idd.t, &od.t, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(embrope_last_error()).find("table is null") != std::string::npos);
}

TEST_CASE("embrope_embed on DLTensors matches the float64 reference", "[c_api][embed]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType id_dtype = GENERATE(DType::int32, DType::int64);
  INFO("dtype " << embrope::dtype_name(dtype) << " ids " << embrope::dtype_name(id_dtype));
  const std::int64_t v = 30, d = 16, b = 2, s = 5, n = b * s;
  const std::uint64_t seed = ref::seed_of({static_cast<int>(dtype), static_cast<int>(id_dtype), 2});
  ref::Buffer table(dtype, v * d), ids(id_dtype, 2 + n), out(dtype, 4 + n * d);
  ref::fill_random(table, seed);
  ref::fill_random_indices(ids, seed + 1, 0, v - 1);
  ref::poison(out);
  DL td(table, {v, d}), id(ids, {b, s}, {}, 2), od(out, {b, s, d}, {}, 4);
  ref::EmbedSpec spec;
  spec.table = &table;
  spec.vocab = v;
  spec.dim = d;
  spec.table_stride = d;

  SECTION("default options (NULL), ids and out through byte_offset") {
    REQUIRE(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_OK);
  }
  ref::Buffer pos_table(dtype, 12 * d), offsets(DType::int64, b);
  SECTION("scale and learned positions with offsets") {
    ref::fill_random(pos_table, seed + 2);
    offsets.set_index(0, 7);
    offsets.set_index(1, 0);
    DL pt(pos_table, {12, d}), off(offsets, {b});
    embrope_embed_options_t opt;
    embrope_embed_options_init(&opt);
    opt.scale = 4.0f;
    opt.positions = EMBROPE_POSITIONS_LEARNED;
    opt.position_table = &pt.t;
    opt.position_offsets = &off.t;
    REQUIRE(embrope_embed(&td.t, &id.t, &od.t, &opt, nullptr) == EMBROPE_OK);
    spec.scale = 4.0;
    spec.positions = ref::Positions::learned;
    spec.position_table = &pos_table;
    spec.max_positions = 12;
    spec.position_stride = d;
  }
  SECTION("sinusoidal split positions") {
    embrope_embed_options_t opt;
    embrope_embed_options_init(&opt);
    opt.positions = EMBROPE_POSITIONS_SINUSOIDAL;
    opt.sinusoid_layout = EMBROPE_SINUSOID_SPLIT;
    opt.sinusoid_base = 1000.0;
    REQUIRE(embrope_embed(&td.t, &id.t, &od.t, &opt, nullptr) == EMBROPE_OK);
    spec.positions = ref::Positions::sinusoidal;
    spec.base = 1000.0;
    spec.split = true;
  }
  ref::Mismatches m;
  std::vector<double> want, mag;
  for (std::int64_t row = 0; row < n; ++row) {
    const std::int64_t p =
        spec.positions == ref::Positions::learned ? offsets.get_index(row / s) + row % s : row % s;
    REQUIRE(ref::embed_row(spec, ids.get_index(2 + row), p, 0, want, mag));
    const double norm = ref::norm(want);
    for (std::int64_t e = 0; e < d; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      m.expect_close(
          [&] {
            return ref::where("out", {row, e});
          },
          out.get(4 + row * d + e), want[ue], ref::tolerance(dtype, want[ue], norm, mag[ue]));
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
  for (std::int64_t i = 0; i < 4; ++i) CHECK(out.get(i) != out.get(i));  // still poison (NaN)
}

TEST_CASE("embrope_embed with a norm gives the C++ API's bytes", "[c_api][embed][norm]") {
  const std::int64_t v = 30, d = 96, n = 12;
  for (auto norm : {EMBROPE_NORM_LAYER_NORM, EMBROPE_NORM_RMS_NORM}) {
    INFO("norm " << static_cast<int>(norm));
    ref::Buffer table(DType::bfloat16, v * d), ids(DType::int64, n), weight(DType::float32, d);
    ref::Buffer bias(DType::bfloat16, d), types(DType::bfloat16, 2 * d), type_ids(DType::int32, n);
    ref::Buffer out(DType::bfloat16, n * d), pre(DType::float32, n * d);
    ref::Buffer out_cpp(DType::bfloat16, n * d), pre_cpp(DType::float32, n * d);
    ref::fill_random(table, 61);
    ref::fill_random_indices(ids, 62, 0, v - 1);
    ref::fill_random(weight, 63);
    ref::fill_random(bias, 64);
    ref::fill_random(types, 65);
    ref::fill_random_indices(type_ids, 66, 0, 1);
    const bool layer = norm == EMBROPE_NORM_LAYER_NORM;
    DL td(table, {v, d}), id(ids, {n}), od(out, {n, d}), wd(weight, {d}), bd(bias, {d});
    DL tt(types, {2, d}), ti(type_ids, {n}), pd(pre, {n, d});
    embrope_embed_options_t opt;
    embrope_embed_options_init(&opt);
    opt.type_table = &tt.t;
    opt.type_ids = &ti.t;
    opt.norm = norm;
    opt.norm_weight = &wd.t;
    if (layer) opt.norm_bias = &bd.t;
    opt.norm_eps = 1e-12f;
    opt.norm_unit_offset = 1;
    opt.pre_norm_out = &pd.t;
    REQUIRE(embrope_embed(&td.t, &id.t, &od.t, &opt, nullptr) == EMBROPE_OK);

    embrope::EmbedOptions o;
    o.type_table = ref::view(types, 0, {2, d});
    o.type_ids = ref::view(type_ids, 0, {n});
    o.norm = layer ? embrope::Normalization::layer_norm : embrope::Normalization::rms_norm;
    o.norm_weight = ref::view(weight, 0, {d});
    if (layer) o.norm_bias = ref::view(bias, 0, {d});
    o.norm_eps = 1e-12f;
    o.norm_unit_offset = true;
    o.pre_norm_out = ref::view(pre_cpp, 0, {n, d});
    embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}),
                   ref::view(out_cpp, 0, {n, d}), o);
    CHECK(out.snapshot() == out_cpp.snapshot());
    CHECK(pre.snapshot() == pre_cpp.snapshot());
    o.norm_unit_offset = false;  // the flag travels: without it the bytes differ
    embrope::embed(ref::view(table, 0, {v, d}), ref::view(ids, 0, {n}),
                   ref::view(out_cpp, 0, {n, d}), o);
    CHECK(out.snapshot() != out_cpp.snapshot());

    opt.norm = static_cast<embrope_normalization_t>(7);
    CHECK(embrope_embed(&td.t, &id.t, &od.t, &opt, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embrope_embed") && Catch::Contains("norm 7"));
  }
}

TEST_CASE("embrope_embed status codes and messages", "[c_api][embed][errors]") {
  const std::int64_t v = 10, d = 8, n = 4;
  ref::Buffer table(DType::float32, v * d), ids(DType::int64, n), out(DType::float32, n * d);
  ref::fill_random(table, 21);
  for (std::int64_t i = 0; i < n; ++i) ids.set_index(i, i);
  ref::poison(out);
  DL td(table, {v, d}), id(ids, {n}), od(out, {n, d});
  REQUIRE(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_OK);

  SECTION("an id outside the vocabulary: INDEX_OUT_OF_RANGE naming ids[index] and the value") {
    ref::poison(out);
    ids.set_index(2, 10);
    CHECK(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
    CHECK_THAT(last_error(),
               Catch::Contains("embed") && Catch::Contains("ids[2]") && Catch::Contains("10"));
    for (std::int64_t row = 0; row < n; ++row) {
      for (std::int64_t e = 0; e < d; ++e) {
        const double want = row == 2 ? 0.0 : table.get(ids.get_index(row) * d + e);
        INFO("row " << row << " element " << e);
        CHECK(out.get(row * d + e) == want);
      }
    }
  }
  SECTION("null tensor pointers") {
    CHECK(embrope_embed(nullptr, &id.t, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("table"));
    CHECK(embrope_embed(&td.t, nullptr, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("ids"));
    CHECK(embrope_embed(&td.t, &id.t, nullptr, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("out"));
  }
  SECTION("lanes 4 on the table") {
    td.t.dtype.lanes = 4;
    CHECK(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("lanes"));
  }
  SECTION("float64 table") {
    td.t.dtype = DLDataType{kDLFloat, 64, 1};
    CHECK(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("table"));
  }
  SECTION("float64 out") {
    od.t.dtype = DLDataType{kDLFloat, 64, 1};
    CHECK(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("out"));
  }
  SECTION("int16 ids") {
    id.t.dtype = DLDataType{kDLInt, 16, 1};
    CHECK(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("embed") && Catch::Contains("ids"));
  }
  SECTION("kDLCUDA tensors without a GPU") {
    if (embrope_cuda_device_count() > 0) {
      WARN("a GPU is present: the no-GPU error path is not exercised");
      return;
    }
    td.t.device = DLDevice{kDLCUDA, 0};
    id.t.device = DLDevice{kDLCUDA, 0};
    od.t.device = DLDevice{kDLCUDA, 0};
    const embrope_status_t st = embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr);
    CHECK((st == EMBROPE_ERROR_NOT_IMPLEMENTED || st == EMBROPE_ERROR_INVALID_ARGUMENT));
    CHECK_THAT(last_error(), Catch::Contains("embed"));
  }
  SECTION("kDLCUDA ids with CPU table and out") {
    id.t.device = DLDevice{kDLCUDA, 0};
    const embrope_status_t st = embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr);
    CHECK((st == EMBROPE_ERROR_NOT_IMPLEMENTED || st == EMBROPE_ERROR_INVALID_ARGUMENT));
    CHECK_THAT(last_error(), Catch::Contains("embed"));
  }
  SECTION("an unsupported device type (OpenCL)") {
    td.t.device = DLDevice{kDLOpenCL, 0};
    id.t.device = DLDevice{kDLOpenCL, 0};
    od.t.device = DLDevice{kDLOpenCL, 0};
    const embrope_status_t st = embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr);
    CHECK((st == EMBROPE_ERROR_NOT_IMPLEMENTED || st == EMBROPE_ERROR_INVALID_ARGUMENT));
    CHECK_THAT(last_error(), Catch::Contains("embed"));
  }
}

// NumPy reports every stride of an array without elements as 0, and DLPack passes that on.
// Such a tensor addresses no memory: the call is a no-op, not a stride error.
TEST_CASE("zero-size DLTensors with zero strides are no-ops", "[c_api][rope][embed]") {
  const CCache cache(8, 10000.0, 16);
  ref::Buffer q(DType::float32, 8), pos(DType::int64, 1), table(DType::float32, 10 * 8),
      ids(DType::int64, 1), out(DType::float32, 1);
  ref::fill_random(table, 3);
  SECTION("apply_rope, no tokens and no heads") {
    for (const std::vector<std::int64_t>& shape :
         {std::vector<std::int64_t>{0, 2, 8}, std::vector<std::int64_t>{3, 0, 8}}) {
      DL qd(q, shape, {0, 0, 0}), pd(pos, {shape[0]}, {0});
      CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
            EMBROPE_OK);
    }
  }
  SECTION("embed of ids [2, 0] into out [2, 0, 8]") {
    DL td(table, {10, 8}), id(ids, {2, 0}, {0, 0}), od(out, {2, 0, 8}, {0, 0, 0});
    CHECK(embrope_embed(&td.t, &id.t, &od.t, nullptr, nullptr) == EMBROPE_OK);
  }
  SECTION("a zero stride on a tensor with elements is still an error") {
    DL qd(q, {1, 1, 8}, {8, 8, 0}), pd(pos, {1});
    CHECK(embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, nullptr, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Catch::Contains("stride 0 in its last dimension"));
  }
}

// ----------------------------------------------------------- scaling variants ---------

TEST_CASE("C scaling variants: frequencies, caches and info agree with the C++ API",
          "[c_api][rope_cache][scaling]") {
  embrope_rope_config_t c;
  embrope_rope_config_init(&c);
  c.rotary_dim = 64;
  c.base = 10000.0;
  c.max_positions = 256;
  c.scaling = EMBROPE_ROPE_SCALING_YARN;
  c.factor = 40.0;
  c.original_max_positions = 4096;
  c.mscale = 0.707;
  c.mscale_all_dim = 1.0;
  std::vector<double> inv(32);
  double attention = 0.0;
  REQUIRE(embrope_rope_frequencies(&c, inv.data(), 32, &attention) == EMBROPE_OK);
  embrope::RopeConfig cpp{64, 10000.0, 256};
  cpp.scaling = embrope::RopeScaling::yarn;
  cpp.factor = 40.0;
  cpp.original_max_positions = 4096;
  cpp.mscale = 0.707;
  cpp.mscale_all_dim = 1.0;
  const embrope::RopeFrequencies want = embrope::rope_frequencies(cpp);
  CHECK(inv == want.inv_freq);
  CHECK(attention == want.attention_factor);
  CHECK(attention != 1.0);
  CHECK(embrope_rope_frequencies(&c, inv.data(), 31, &attention) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(embrope_last_error(), "capacity"));

  // longrope with factor arrays: copied at creation, visible through info.
  std::vector<double> short_f(32, 1.5), long_f(32, 3.0);
  embrope_rope_config_init(&c);
  c.rotary_dim = 64;
  c.max_positions = 128;
  c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
  c.original_max_positions = 64;
  c.factor = 2.0;
  c.short_factor = short_f.data();
  c.long_factor = long_f.data();
  c.num_factors = 32;
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
  short_f.assign(32, 99.0);  // the cache keeps its own copy
  embrope_rope_config_t info;
  embrope_rope_config_init(&info);
  REQUIRE(embrope_rope_cache_info(cache, &info, nullptr) == EMBROPE_OK);
  CHECK(info.scaling == EMBROPE_ROPE_SCALING_LONGROPE);
  CHECK(info.num_factors == 32);
  CHECK(info.short_factor[5] == 1.5);
  CHECK(info.long_factor[5] == 3.0);
  CHECK(info.original_max_positions == 64);
  CHECK(info.factor == 2.0);
  // max_positions 128 > 64: long factors; position 1, frequency 0: cos(1 / 3) * sqrt(1 + ln 2 / ln
  // 64)
  std::vector<float> cos(128 * 32), sin(128 * 32);
  REQUIRE(embrope_rope_cache_copy_to_host(cache, cos.data(), sin.data()) == EMBROPE_OK);
  const double m = std::sqrt(1.0 + std::log(2.0) / std::log(64.0));
  CHECK(cos[32] == static_cast<float>(std::cos(1.0 / 3.0) * m));
  CHECK(embrope_rope_cache_destroy(cache) == EMBROPE_OK);

  // Errors: a bad enum value, arrays without a length, a wrong length.
  c.scaling = static_cast<embrope_rope_scaling_t>(42);
  CHECK(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(embrope_last_error(), "scaling"));
  c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
  c.num_factors = 0;
  CHECK(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(embrope_last_error(), "num_factors"));
  c.num_factors = 31;
  CHECK(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(embrope_last_error(), "short_factor"));
}

TEST_CASE("C axial RoPE through embrope_rope_cache_create_axial and options.axes_dim",
          "[c_api][rope][axial]") {
  const std::int64_t t = 3, h = 2, d = 64;
  ref::Buffer q(DType::float32, t * h * d), q2(DType::float32, t * h * d), pos(DType::int64, 3 * t);
  ref::fill_random(q, 63);
  ref::fill_random_indices(pos, 64, 0, 31);
  const ref::Buffer q0 = q;
  q2 = q;
  const embrope::RopeCache cpp_cache = embrope::RopeCache::axial(
      {embrope::RopeConfig{16, 10000.0, 32}, {24, 100.0, 32}, {24, 100.0, 32}});
  embrope::RopeOptions cpp;
  cpp.layout = embrope::RopeLayout::interleaved;
  embrope::apply_rope(ref::view(q2, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                      cpp_cache, cpp);

  embrope_rope_config_t axes[3];
  const std::int64_t dims[3] = {16, 24, 24};
  const double bases[3] = {10000.0, 100.0, 100.0};
  const embrope_rope_config_t* axis_pointers[3];
  for (int a = 0; a < 3; ++a) {
    embrope_rope_config_init(&axes[a]);
    axes[a].rotary_dim = dims[a];
    axes[a].base = bases[a];
    axes[a].max_positions = 32;
    axis_pointers[a] = &axes[a];
  }
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create_axial(axis_pointers, 3, DLDevice{kDLCPU, 0}, nullptr, &cache) ==
          EMBROPE_OK);
  std::int64_t got[4] = {-1, -1, -1, -1};
  REQUIRE(embrope_rope_cache_axes_dim(cache, got) == EMBROPE_OK);
  CHECK((got[0] == 16 && got[1] == 24 && got[2] == 24 && got[3] == 0));
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  CHECK((o.axes_dim[0] == 0 && o.axes_dim[3] == 0));
  o.layout = EMBROPE_ROPE_INTERLEAVED;
  std::int64_t q_shape[] = {t, h, d}, p_shape[] = {3, t};
  DLTensor qt{q.data(), DLDevice{kDLCPU, 0}, 3, {kDLFloat, 32, 1}, q_shape, nullptr, 0};
  DLTensor pt{pos.data(), DLDevice{kDLCPU, 0}, 2, {kDLInt, 64, 1}, p_shape, nullptr, 0};
  REQUIRE(embrope_apply_rope(&qt, nullptr, &pt, cache, &o, nullptr) == EMBROPE_OK);
  CHECK(q.snapshot() == q2.snapshot());
  CHECK(q.snapshot() != q0.snapshot());

  SECTION("options.axes_dim that disagrees with the cache's is refused") {
    o.axes_dim[0] = 32;
    o.axes_dim[1] = 32;
    CHECK(embrope_apply_rope(&qt, nullptr, &pt, cache, &o, nullptr) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(embrope_last_error(), Catch::Contains("axes_dim [32, 32, 0, 0]"));
  }
  SECTION("bad arguments of the axial create") {
    embrope_rope_cache_t* other = nullptr;
    CHECK(embrope_rope_cache_create_axial(axis_pointers, 5, DLDevice{kDLCPU, 0}, nullptr, &other) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(embrope_last_error(), Catch::Contains("num_axes 5 must be 1 to 4"));
    CHECK(embrope_rope_cache_create_axial(nullptr, 1, DLDevice{kDLCPU, 0}, nullptr, &other) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    const embrope_rope_config_t* with_null[2] = {&axes[0], nullptr};
    CHECK(embrope_rope_cache_create_axial(with_null, 2, DLDevice{kDLCPU, 0}, nullptr, &other) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(embrope_last_error(), Catch::Contains("axes[1] is null"));
    axes[1].max_positions = 33;
    CHECK(embrope_rope_cache_create_axial(axis_pointers, 3, DLDevice{kDLCPU, 0}, nullptr, &other) ==
          EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(embrope_last_error(), Catch::Contains("axis 1 has max_positions 33"));
    CHECK(other == nullptr);
  }
  embrope_rope_cache_destroy(cache);
}

TEST_CASE("C mrope through embrope_rope_options_t.mrope_section", "[c_api][rope][mrope]") {
  const std::int64_t t = 3, h = 2, d = 64;
  ref::Buffer q(DType::float32, t * h * d), q2(DType::float32, t * h * d), pos(DType::int64, 3 * t);
  ref::fill_random(q, 61);
  q2 = q;
  ref::fill_random_indices(pos, 62, 0, 31);
  const embrope::RopeCache cpp_cache(embrope::RopeConfig{d, 10000.0, 32});
  embrope::RopeOptions cpp;
  cpp.mrope_section = {8, 12, 12};
  embrope::apply_rope(ref::view(q2, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                      cpp_cache, cpp);

  embrope_rope_config_t c;
  embrope_rope_config_init(&c);
  c.rotary_dim = d;
  c.max_positions = 32;
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  o.mrope_section[0] = 8;
  o.mrope_section[1] = 12;
  o.mrope_section[2] = 12;
  std::int64_t q_shape[] = {t, h, d}, p_shape[] = {3, t};
  DLTensor qt{q.data(), DLDevice{kDLCPU, 0}, 3, {kDLFloat, 32, 1}, q_shape, nullptr, 0};
  DLTensor pt{pos.data(), DLDevice{kDLCPU, 0}, 2, {kDLInt, 64, 1}, p_shape, nullptr, 0};
  REQUIRE(embrope_apply_rope(&qt, nullptr, &pt, cache, &o, nullptr) == EMBROPE_OK);
  CHECK(q.snapshot() == q2.snapshot());

  SECTION("interleaved streams (mrope_interleaved), as the C++ option gives them") {
    ref::Buffer q3 = q, q4 = q;
    cpp.mrope_section = {12, 10, 10};  // interleaved: height 1 .. 28, width 2 .. 29, of 32
    cpp.mrope_interleaved = true;
    embrope::apply_rope(ref::view(q4, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {3, t}),
                        cpp_cache, cpp);
    o.mrope_section[0] = 12;
    o.mrope_section[1] = 10;
    o.mrope_section[2] = 10;
    o.mrope_interleaved = 1;
    qt.data = q3.data();
    REQUIRE(embrope_apply_rope(&qt, nullptr, &pt, cache, &o, nullptr) == EMBROPE_OK);
    CHECK(q3.snapshot() == q4.snapshot());
  }
  embrope_rope_cache_destroy(cache);
}

// ------------------------------------------------------------ backward passes -----------

TEST_CASE("embrope_embed_backward_options_init sets the documented defaults",
          "[c_api][embed_backward]") {
  embrope_embed_backward_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  embrope_embed_backward_options_init(&o);
  CHECK(o.scale == 1.0f);
  CHECK(o.vocab_start == 0);
  CHECK(o.vocab_shard == 0);
  CHECK(o.has_padding_idx == 0);
  CHECK(o.padding_idx == 0);
  CHECK(o.grad_position_table == nullptr);
  CHECK(o.position_ids == nullptr);
  CHECK(o.position_offsets == nullptr);
  CHECK(o.grad_type_table == nullptr);
  CHECK(o.type_ids == nullptr);
  CHECK(o.mode == EMBROPE_BACKWARD_DETERMINISTIC);
  CHECK(o.workspace == nullptr);
  CHECK(o.workspace_bytes == 0);
}

TEST_CASE("C embed_backward: scale, padding and learned positions against float64",
          "[c_api][embed_backward]") {
  const std::int64_t v = 12, d = 16, b = 2, s = 9, p = 20;
  ref::Buffer grad_out(DType::bfloat16, b * s * d), ids(DType::int32, b * s);
  ref::Buffer grad(DType::float32, v * d), pos_grad(DType::bfloat16, p * d);
  ref::Buffer offsets(DType::int64, b);
  ref::fill_random(grad_out, 51);
  ref::fill_random_indices(ids, 52, 0, v - 1);
  ids.set_index(3, 4);  // the padding id appears at least once
  ref::fill_random(grad, 53);
  ref::fill_random(pos_grad, 54);
  offsets.set_index(0, 0);
  offsets.set_index(1, 7);
  std::vector<double> want_t(static_cast<std::size_t>(v * d)),
      want_p(static_cast<std::size_t>(p * d));
  std::vector<double> mag_t(want_t.size()), mag_p(want_p.size());
  std::vector<std::int64_t> count_t(static_cast<std::size_t>(v)),
      count_p(static_cast<std::size_t>(p));
  for (std::int64_t i = 0; i < v * d; ++i) {
    want_t[static_cast<std::size_t>(i)] = grad.get(i);
    mag_t[static_cast<std::size_t>(i)] = std::fabs(grad.get(i));
  }
  for (std::int64_t i = 0; i < p * d; ++i) {
    want_p[static_cast<std::size_t>(i)] = pos_grad.get(i);
    mag_p[static_cast<std::size_t>(i)] = std::fabs(pos_grad.get(i));
  }
  const double scale = 0.5;
  for (std::int64_t n = 0; n < b * s; ++n) {
    const std::int64_t id = ids.get_index(n);
    const std::int64_t position = offsets.get_index(n / s) + n % s;
    for (std::int64_t e = 0; e < d; ++e) {
      const double g = grad_out.get(n * d + e);
      if (id != 4) {
        want_t[static_cast<std::size_t>(id * d + e)] += scale * g;
        mag_t[static_cast<std::size_t>(id * d + e)] += std::fabs(scale * g);
      }
      want_p[static_cast<std::size_t>(position * d + e)] += g;
      mag_p[static_cast<std::size_t>(position * d + e)] += std::fabs(g);
    }
    if (id != 4) ++count_t[static_cast<std::size_t>(id)];
    ++count_p[static_cast<std::size_t>(position)];
  }
  DL g(grad_out, {b, s, d}), i(ids, {b, s}), t(grad, {v, d}), pt(pos_grad, {p, d}),
      off(offsets, {b});
  embrope_embed_backward_options_t o;
  embrope_embed_backward_options_init(&o);
  o.scale = static_cast<float>(scale);
  o.has_padding_idx = 1;
  o.padding_idx = 4;
  o.grad_position_table = &pt.t;
  o.position_offsets = &off.t;
  std::size_t bytes = 123;
  REQUIRE(embrope_embed_backward_workspace_size(&g.t, &i.t, &t.t, &o, &bytes) == EMBROPE_OK);
  CHECK(bytes == 0);
  REQUIRE(embrope_embed_backward(&g.t, &i.t, &t.t, &o, nullptr) == EMBROPE_OK);
  ref::Mismatches m;
  for (std::int64_t k = 0; k < v * d; ++k) {
    const auto uk = static_cast<std::size_t>(k);
    const double tol = static_cast<double>(count_t[uk / d] + 2) * std::ldexp(mag_t[uk], -24);
    m.expect_close(
        [&] {
          return ref::where("grad_table", {k / d, k % d});
        },
        grad.get(k), want_t[uk], tol);
  }
  for (std::int64_t k = 0; k < p * d; ++k) {
    const auto uk = static_cast<std::size_t>(k);
    const double tol = ref::ulp(DType::bfloat16, want_p[uk]) +
                       static_cast<double>(count_p[uk / d] + 2) * std::ldexp(mag_p[uk], -24);
    m.expect_close(
        [&] {
          return ref::where("grad_position_table", {k / d, k % d});
        },
        pos_grad.get(k), want_p[uk], tol);
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

TEST_CASE("C embed_backward status codes", "[c_api][embed_backward][errors]") {
  ref::Buffer grad_out(DType::float32, 4 * 8), ids(DType::int64, 4), grad(DType::float32, 5 * 8);
  ref::fill_random(grad_out, 61);
  ref::fill_random(grad, 62);
  ref::fill_random_indices(ids, 63, 0, 4);
  ids.set_index(2, 5);
  DL g(grad_out, {4, 8}), i(ids, {4}), t(grad, {5, 8});
  CHECK(embrope_embed_backward(&g.t, &i.t, &t.t, nullptr, nullptr) ==
        EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
  CHECK_THAT(last_error(), Catch::Contains("embed_backward") && Catch::Contains("ids[2] = 5"));
  embrope_embed_backward_options_t o;
  embrope_embed_backward_options_init(&o);
  const int bad_mode = 9;  // as a C caller may store it (a C enum is an int)
  std::memcpy(&o.mode, &bad_mode, sizeof bad_mode);
  CHECK(embrope_embed_backward(&g.t, &i.t, &t.t, &o, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("embrope_embed_backward") && Catch::Contains("mode"));
  CHECK(embrope_embed_backward(nullptr, &i.t, &t.t, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("grad_out") && Catch::Contains("null"));
  CHECK(embrope_embed_backward_workspace_size(&g.t, &i.t, &t.t, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("C embed_backward with embed's norm is the C++ call; an older struct has no norm",
          "[c_api][embed_backward][norm][abi]") {
  const std::int64_t n = 6, d = 16, v = 5;
  ref::Buffer grad_out(DType::float32, n * d), pre(DType::float32, n * d), ids(DType::int64, n);
  ref::Buffer weight(DType::float32, d);
  ref::fill_random(grad_out, 71);
  ref::fill_random(pre, 72);
  ref::fill_random(weight, 73);
  ref::fill_random_indices(ids, 74, 0, v - 1);
  struct Grads {
    ref::Buffer table{DType::float32, v*d}, weight{DType::float32, d}, bias{DType::float32, d};
  };
  const auto zeroed = [] {
    Grads g;
    for (std::int64_t k = 0; k < v * d; ++k) g.table.set(k, 0.0);
    return g;
  };
  // The C++ calls: with the norm, and without.
  Grads cpp = zeroed(), plain = zeroed();
  embrope::EmbedBackwardOptions co;
  co.norm = embrope::Normalization::layer_norm;
  co.pre_norm = ref::view(pre, 0, {n, d});
  co.norm_weight = ref::view(weight, 0, {d});
  co.grad_norm_weight = ref::view(cpp.weight, 0, {d});
  co.grad_norm_bias = ref::view(cpp.bias, 0, {d});
  embrope::embed_backward(ref::view(grad_out, 0, {n, d}), ref::view(ids, 0, {n}),
                          ref::view(cpp.table, 0, {v, d}), co);
  embrope::embed_backward(ref::view(grad_out, 0, {n, d}), ref::view(ids, 0, {n}),
                          ref::view(plain.table, 0, {v, d}));

  Grads c = zeroed();
  DL g(grad_out, {n, d}), i(ids, {n}), pr(pre, {n, d}), w(weight, {d}), t(c.table, {v, d}),
      gw(c.weight, {d}), gb(c.bias, {d});
  embrope_embed_backward_options_t o;
  embrope_embed_backward_options_init(&o);
  o.norm = EMBROPE_NORM_LAYER_NORM;
  o.pre_norm = &pr.t;
  o.norm_weight = &w.t;
  o.grad_norm_weight = &gw.t;
  o.grad_norm_bias = &gb.t;
  REQUIRE(embrope_embed_backward(&g.t, &i.t, &t.t, &o, nullptr) == EMBROPE_OK);
  CHECK(c.table.snapshot() == cpp.table.snapshot());
  CHECK(c.weight.snapshot() == cpp.weight.snapshot());
  CHECK(c.bias.snapshot() == cpp.bias.snapshot());
  CHECK(c.table.snapshot() != plain.table.snapshot());  // the norm matters

  o.pre_norm = nullptr;
  CHECK(embrope_embed_backward(&g.t, &i.t, &t.t, &o, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(),
             Catch::Contains("embrope_embed_backward") && Catch::Contains("pre_norm"));
  const int bad_norm = 5;
  std::memcpy(&o.norm, &bad_norm, sizeof bad_norm);
  CHECK(embrope_embed_backward(&g.t, &i.t, &t.t, &o, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("norm 5"));

  // A header before the norm fields: its struct ends at `norm`; the bytes past it (0xAB,
  // which as norm would be an error) are not read: no norm.
  const std::size_t older = offsetof(embrope_embed_backward_options_t, norm);
  alignas(embrope_embed_backward_options_t) unsigned char
      bytes[sizeof(embrope_embed_backward_options_t)];
  std::memset(bytes, 0xAB, sizeof bytes);
  auto* old_options = reinterpret_cast<embrope_embed_backward_options_t*>(bytes);
  embrope_embed_backward_options_init_size(old_options, older);
  for (std::size_t k = older; k < sizeof bytes; ++k) REQUIRE(bytes[k] == 0xAB);
  Grads from_old = zeroed();
  DL t_old(from_old.table, {v, d});
  REQUIRE(embrope_embed_backward(&g.t, &i.t, &t_old.t, old_options, nullptr) == EMBROPE_OK);
  CHECK(from_old.table.snapshot() == plain.table.snapshot());
}

TEST_CASE("C apply_rope_backward undoes apply_rope, with the cache and with cos/sin",
          "[c_api][rope_backward]") {
  const std::int64_t t = 5, h = 3, d = 32;
  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = d;
  config.max_positions = 64;
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, t);
  ref::Buffer cos(DType::float32, 64 * d / 2), sin(DType::float32, 64 * d / 2);
  ref::fill_random(q, 71);
  ref::fill_random_indices(pos, 72, 0, 63);
  REQUIRE(embrope_rope_cache_copy_to_host(cache, static_cast<float*>(cos.data()),
                                          static_cast<float*>(sin.data())) == EMBROPE_OK);
  const ref::Buffer q0 = q;
  DL dq(q, {t, h, d}), dp(pos, {t}), dc(cos, {64, d / 2}), ds(sin, {64, d / 2});
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  o.layout = EMBROPE_ROPE_INTERLEAVED;
  for (int round = 0; round < 2; ++round) {
    REQUIRE(embrope_apply_rope(&dq.t, nullptr, &dp.t, cache, &o, nullptr) == EMBROPE_OK);
    if (round == 0) {
      REQUIRE(embrope_apply_rope_backward(&dq.t, nullptr, &dp.t, cache, &o, nullptr) == EMBROPE_OK);
    } else {
      REQUIRE(embrope_apply_rope_backward_cos_sin(&dq.t, nullptr, &dp.t, &dc.t, &ds.t, &o,
                                                  nullptr) == EMBROPE_OK);
    }
    ref::Mismatches m;
    for (std::int64_t row = 0; row < t * h; ++row) {
      double norm = 0.0;
      for (std::int64_t e = 0; e < d; ++e) norm += q0.get(row * d + e) * q0.get(row * d + e);
      for (std::int64_t e = 0; e < d; ++e) {
        m.expect_close(
            [&] {
              return ref::where("q", {row, e});
            },
            q.get(row * d + e), q0.get(row * d + e), 2 * ref::kFloat32RelTol * std::sqrt(norm));
      }
    }
    INFO(m.summary());
    CHECK(m.count == 0);
  }
  CHECK(embrope_apply_rope_backward(&dq.t, nullptr, &dp.t, nullptr, &o, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("embrope_apply_rope_backward"));
  CHECK(embrope_rope_cache_destroy(cache) == EMBROPE_OK);
}

TEST_CASE("C deferred status: ops record bad rows instead of failing, check reports and clears",
          "[c_api][deferred]") {
  embrope_deferred_status_t* status = nullptr;
  REQUIRE(embrope_deferred_status_create(DLDevice{kDLCPU, 0}, &status) == EMBROPE_OK);
  REQUIRE(status != nullptr);
  CHECK(embrope_deferred_status_check(status, nullptr) == EMBROPE_OK);

  // RoPE with position 40 outside a 32-row cache.
  embrope_rope_config_t c;
  embrope_rope_config_init(&c);
  c.rotary_dim = 16;
  c.max_positions = 32;
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
  std::vector<float> q(3 * 2 * 16, 0.5f);
  std::vector<std::int64_t> pos = {1, 40, 2};
  std::int64_t q_shape[] = {3, 2, 16}, p_shape[] = {3};
  DLTensor qt{q.data(), DLDevice{kDLCPU, 0}, 3, {kDLFloat, 32, 1}, q_shape, nullptr, 0};
  DLTensor pt{pos.data(), DLDevice{kDLCPU, 0}, 1, {kDLInt, 64, 1}, p_shape, nullptr, 0};
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  o.deferred = status;
  CHECK(embrope_apply_rope(&qt, nullptr, &pt, cache, &o, nullptr) == EMBROPE_OK);
  for (int e = 0; e < 32; ++e) CHECK(q[32 + e] == 0.0f);  // token 1 zero-filled
  CHECK(embrope_deferred_status_check(status, nullptr) == EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
  CHECK(ref::mentions(embrope_last_error(), "positions[1]"));
  CHECK(ref::mentions(embrope_last_error(), "40"));
  CHECK(embrope_deferred_status_check(status, nullptr) == EMBROPE_OK);  // cleared

  // embed with id 9 outside a 4-row table.
  std::vector<float> table(4 * 8, 1.0f), out(2 * 8, -1.0f);
  std::vector<std::int64_t> ids = {3, 9};
  std::int64_t t_shape[] = {4, 8}, i_shape[] = {2}, o_shape[] = {2, 8};
  DLTensor tt{table.data(), DLDevice{kDLCPU, 0}, 2, {kDLFloat, 32, 1}, t_shape, nullptr, 0};
  DLTensor it{ids.data(), DLDevice{kDLCPU, 0}, 1, {kDLInt, 64, 1}, i_shape, nullptr, 0};
  DLTensor ot{out.data(), DLDevice{kDLCPU, 0}, 2, {kDLFloat, 32, 1}, o_shape, nullptr, 0};
  embrope_embed_options_t eo;
  embrope_embed_options_init(&eo);
  eo.deferred = status;
  CHECK(embrope_embed(&tt, &it, &ot, &eo, nullptr) == EMBROPE_OK);
  CHECK(out[8] == 0.0f);
  CHECK(embrope_deferred_status_check(status, nullptr) == EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
  CHECK(ref::mentions(embrope_last_error(), "ids[1]"));

  CHECK(embrope_deferred_status_check(nullptr, nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(embrope_deferred_status_create(DLDevice{kDLCPU, 0}, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(embrope_deferred_status_destroy(nullptr) == EMBROPE_OK);
  CHECK(embrope_deferred_status_destroy(status) == EMBROPE_OK);
  embrope_rope_cache_destroy(cache);
}

TEST_CASE("C apply_rope_append_kv: float8 paged and combined caches equal the C++ API's bytes",
          "[c_api][apply_rope_append_kv]") {
  const std::int64_t t = 6, hq = 4, hk = 2, d = 64, pages = 2, page = 4;
  const CCache cache(d, 10000.0, 32);
  const embrope::RopeCache cpp_cache({d, 10000.0, 32});
  ref::Buffer q(DType::bfloat16, t * hq * d), k(DType::bfloat16, t * hk * d),
      v(DType::bfloat16, t * hk * d), pos(DType::int64, t), slots(DType::int32, t);
  ref::fill_random(q, 71);
  ref::fill_random(k, 72);
  ref::fill_random(v, 73);
  ref::fill_random_indices(pos, 74, 0, 31);
  const std::int32_t slot_values[t] = {3, 0, -1, 7, 5, 2};
  for (std::int64_t i = 0; i < t; ++i) slots.set_index(i, slot_values[i]);
  ref::Buffer kc(DType::float8_e4m3fn, pages * page * hk * d), vc = kc;
  ref::poison(kc);
  ref::poison(vc);
  ref::Buffer q2 = q, kc2 = kc, vc2 = vc;

  DL qd(q, {t, hq, d}), kd(k, {t, hk, d}), vd(v, {t, hk, d}), pd(pos, {t}), sd(slots, {t});
  DL kcd(kc, {pages, page, hk, d}), vcd(vc, {pages, page, hk, d});
  embrope_kv_cache_t kv;
  embrope_kv_cache_init(&kv);
  CHECK(kv.layout == EMBROPE_KV_NHD);
  CHECK(kv.k_scale == 1.0f);
  kv.k_cache = &kcd.t;
  kv.v_cache = &vcd.t;
  kv.k_scale = 0.02f;
  kv.v_scale = 0.5f;
  kv.slot_mapping = &sd.t;
  REQUIRE(embrope_apply_rope_append_kv(&qd.t, &kd.t, &vd.t, &pd.t, cache.handle, &kv, nullptr,
                                       nullptr) == EMBROPE_OK);

  embrope::KvCache cpp_kv;
  cpp_kv.k = ref::view(kc2, 0, {pages, page, hk, d});
  cpp_kv.v = ref::view(vc2, 0, {pages, page, hk, d});
  cpp_kv.k_scale = 0.02f;
  cpp_kv.v_scale = 0.5f;
  embrope::apply_rope_append_kv(ref::view(q2, 0, {t, hq, d}), ref::view(k, 0, {t, hk, d}),
                                ref::view(v, 0, {t, hk, d}), ref::view(pos, 0, {t}), cpp_cache,
                                cpp_kv, embrope::KvSlots::paged(ref::view(slots, 0, {t})));
  CHECK(kc.snapshot() == kc2.snapshot());
  CHECK(vc.snapshot() == vc2.snapshot());
  CHECK(q.snapshot() == q2.snapshot());
  ref::Buffer poisoned = kc;
  ref::poison(poisoned);
  CHECK(kc.snapshot() != poisoned.snapshot());

  // Errors: a null kv, both forms of cache, a bad slot.
  CHECK(embrope_apply_rope_append_kv(&qd.t, &kd.t, &vd.t, &pd.t, cache.handle, nullptr, nullptr,
                                     nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(last_error(), "kv is null"));
  embrope_kv_cache_t both = kv;
  both.kv_cache = &kcd.t;
  CHECK(embrope_apply_rope_append_kv(&qd.t, &kd.t, &vd.t, &pd.t, cache.handle, &both, nullptr,
                                     nullptr) == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(ref::mentions(last_error(), "not both"));
  slots.set_index(4, 8);
  CHECK(embrope_apply_rope_append_kv(&qd.t, &kd.t, &vd.t, &pd.t, cache.handle, &kv, nullptr,
                                     nullptr) == EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
  CHECK(ref::mentions(last_error(), "slot_mapping[4] = 8"));
}

TEST_CASE("C apply_qk_norm_rope and its backward give the C++ API's bytes",
          "[c_api][qk_norm_rope]") {
  const std::int64_t t = 6, hq = 4, hk = 2, d = 64;
  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = 32;
  config.max_positions = 64;
  embrope_rope_cache_t* cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
  embrope::RopeCache cpp_cache({32, 10000.0, 64});
  ref::Buffer q(DType::bfloat16, t * hq * d), k(DType::bfloat16, t * hk * d), pos(DType::int32, t);
  ref::Buffer wq(DType::bfloat16, d), wk(DType::float32, d);
  ref::fill_random(q, 91);
  ref::fill_random(k, 92);
  ref::fill_random_indices(pos, 93, 0, 63);
  ref::fill_random(wq, 94);
  ref::fill_random(wk, 95);
  ref::Buffer q2 = q, k2 = k, dq = q, dk = k, dq2 = q, dk2 = k;
  ref::Buffer gq(DType::float32, d), gk(DType::float32, d), gq2(DType::float32, d),
      gk2(DType::float32, d);

  embrope_qk_norm_t n;
  embrope_qk_norm_init(&n);
  CHECK(n.eps == 1e-6f);
  CHECK(n.q_weight == nullptr);
  CHECK(n.unit_offset == 0);
  DL qd(q, {t, hq, d}), kd(k, {t, hk, d}), pd(pos, {t}), wqd(wq, {d}), wkd(wk, {d});
  DL dqd(dq, {t, hq, d}), dkd(dk, {t, hk, d}), gqd(gq, {d}), gkd(gk, {d});
  n.q_weight = &wqd.t;
  n.k_weight = &wkd.t;
  n.unit_offset = 1;
  embrope_qk_norm_gradients_t g;
  embrope_qk_norm_gradients_init(&g);
  g.q_weight = &gqd.t;
  g.k_weight = &gkd.t;
  size_t bytes = 1;
  REQUIRE(embrope_apply_qk_norm_rope_backward_workspace_size(&dqd.t, &dkd.t, &g, &bytes) ==
          EMBROPE_OK);
  CHECK(bytes == 0);  // the CPU needs none
  // Backward first: it reads the saved q and k.
  REQUIRE(embrope_apply_qk_norm_rope_backward(&dqd.t, &dkd.t, &qd.t, &kd.t, &pd.t, cache, &n, &g,
                                              nullptr, nullptr) == EMBROPE_OK);
  REQUIRE(embrope_apply_qk_norm_rope(&qd.t, &kd.t, &pd.t, cache, &n, nullptr, nullptr) ==
          EMBROPE_OK);

  embrope::QkNorm cn;
  cn.q_weight = ref::view(wq, 0, {d});
  cn.k_weight = ref::view(wk, 0, {d});
  cn.unit_offset = true;
  embrope::QkNormGradients cg;
  cg.q_weight = ref::view(gq2, 0, {d});
  cg.k_weight = ref::view(gk2, 0, {d});
  embrope::apply_qk_norm_rope_backward(ref::view(dq2, 0, {t, hq, d}), ref::view(dk2, 0, {t, hk, d}),
                                       ref::view(q2, 0, {t, hq, d}), ref::view(k2, 0, {t, hk, d}),
                                       ref::view(pos, 0, {t}), cpp_cache, cn, cg);
  embrope::apply_qk_norm_rope(ref::view(q2, 0, {t, hq, d}), ref::view(k2, 0, {t, hk, d}),
                              ref::view(pos, 0, {t}), cpp_cache, cn);
  CHECK(q.snapshot() == q2.snapshot());
  CHECK(k.snapshot() == k2.snapshot());
  CHECK(dq.snapshot() == dq2.snapshot());
  CHECK(dk.snapshot() == dk2.snapshot());
  CHECK(gq.snapshot() == gq2.snapshot());
  CHECK(gk.snapshot() == gk2.snapshot());

  n.eps = -1.0f;
  CHECK(embrope_apply_qk_norm_rope(&qd.t, &kd.t, &pd.t, cache, &n, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("embrope_apply_qk_norm_rope") && Catch::Contains("eps"));
  CHECK(embrope_apply_qk_norm_rope(&qd.t, &kd.t, &pd.t, nullptr, nullptr, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(embrope_apply_qk_norm_rope_backward_workspace_size(&dqd.t, &dkd.t, &g, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK(embrope_rope_cache_destroy(cache) == EMBROPE_OK);
}

TEST_CASE("C _cos_sin variants of the KV append and qk-norm ops give the cache variants' bytes",
          "[c_api][cos_sin][apply_rope_append_kv][qk_norm_rope]") {
  // The caller's tables are the cache's own (copied out), so each pair must agree byte for
  // byte; every output must also differ from its input (a call that did nothing would agree).
  const std::int64_t t = 6, hq = 4, hk = 2, d = 64, r = 32, positions = 64, slots_n = 8;
  const CCache cache(r, 10000.0, positions);
  ref::Buffer cos(DType::float32, positions * r / 2), sin = cos, short_cos(DType::float32, 8);
  REQUIRE(embrope_rope_cache_copy_to_host(cache.handle, static_cast<float*>(cos.data()),
                                          static_cast<float*>(sin.data())) == EMBROPE_OK);
  ref::Buffer q(DType::bfloat16, t * hq * d), k(DType::bfloat16, t * hk * d), v = k;
  ref::Buffer pos(DType::int64, t), slots(DType::int64, t), w(DType::float32, d);
  ref::fill_random(q, 111);
  ref::fill_random(k, 112);
  ref::fill_random(v, 113);
  ref::fill_random(w, 114);
  ref::fill_random_indices(pos, 115, 0, positions - 1);
  for (std::int64_t i = 0; i < t; ++i) slots.set_index(i, (i * 5 + 3) % slots_n);
  ref::Buffer kc(DType::bfloat16, slots_n * hk * d), vc = kc;
  ref::poison(kc);
  ref::poison(vc);
  DL pd(pos, {t}), sd(slots, {t}), wd(w, {d}), cd(cos, {positions, r / 2}),
      snd(sin, {positions, r / 2}), short_cd(short_cos, {2, 4});
  embrope_qk_norm_t norm;
  embrope_qk_norm_init(&norm);
  norm.q_weight = &wd.t;
  norm.k_weight = &wd.t;

  // One call on its own copies of q, k, v and the cache, which it returns; `want` its status.
  struct Outputs {
    ref::Buffer q, k, k_cache, v_cache;
  };
  auto attempt = [&](auto&& call, embrope_status_t want) {
    Outputs o{q, k, kc, vc};
    DL qd(o.q, {t, hq, d}), kd(o.k, {t, hk, d}), vd(v, {t, hk, d});
    DL kcd(o.k_cache, {2, slots_n / 2, hk, d}), vcd(o.v_cache, {2, slots_n / 2, hk, d});
    embrope_kv_cache_t kv;
    embrope_kv_cache_init(&kv);
    kv.k_cache = &kcd.t;
    kv.v_cache = &vcd.t;
    kv.slot_mapping = &sd.t;
    const embrope_status_t status = call(qd.t, kd.t, vd.t, kv);
    INFO(last_error());
    REQUIRE(status == want);
    return o;
  };
  auto run = [&](auto&& call) { return attempt(call, EMBROPE_OK); };
  // A refused call writes nothing and names itself and the argument.
  auto refused = [&](auto&& call, const char* function, const char* argument) {
    const Outputs o = attempt(call, EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK(ref::mentions(last_error(), function));
    CHECK(ref::mentions(last_error(), argument));
    CHECK(o.q.snapshot() == q.snapshot());
    CHECK(o.k_cache.snapshot() == kc.snapshot());
  };
  auto check_same = [&](const Outputs& a, const Outputs& b, bool appends) {
    CHECK(a.q.snapshot() == b.q.snapshot());
    CHECK(a.k.snapshot() == b.k.snapshot());
    CHECK(a.q.snapshot() != q.snapshot());
    if (appends) {
      CHECK(a.k_cache.snapshot() == b.k_cache.snapshot());
      CHECK(a.v_cache.snapshot() == b.v_cache.snapshot());
      CHECK(a.k_cache.snapshot() != kc.snapshot());
    }
  };

  SECTION("embrope_apply_rope_append_kv_cos_sin") {
    auto with_cache = run([&](DLTensor& qt, DLTensor& kt, DLTensor& vt, embrope_kv_cache_t& kv) {
      return embrope_apply_rope_append_kv(&qt, &kt, &vt, &pd.t, cache.handle, &kv, nullptr,
                                          nullptr);
    });
    auto with_tables = run([&](DLTensor& qt, DLTensor& kt, DLTensor& vt, embrope_kv_cache_t& kv) {
      return embrope_apply_rope_append_kv_cos_sin(&qt, &kt, &vt, &pd.t, &cd.t, &snd.t, &kv, nullptr,
                                                  nullptr);
    });
    check_same(with_cache, with_tables, true);
    refused(
        [&](DLTensor& qt, DLTensor& kt, DLTensor& vt, embrope_kv_cache_t& kv) {
          return embrope_apply_rope_append_kv_cos_sin(&qt, &kt, &vt, &pd.t, &short_cd.t, &snd.t,
                                                      &kv, nullptr, nullptr);
        },
        "embrope_apply_rope_append_kv_cos_sin", "cos");
  }
  SECTION("embrope_apply_qk_norm_rope_cos_sin") {
    auto with_cache = run([&](DLTensor& qt, DLTensor& kt, DLTensor&, embrope_kv_cache_t&) {
      return embrope_apply_qk_norm_rope(&qt, &kt, &pd.t, cache.handle, &norm, nullptr, nullptr);
    });
    auto with_tables = run([&](DLTensor& qt, DLTensor& kt, DLTensor&, embrope_kv_cache_t&) {
      return embrope_apply_qk_norm_rope_cos_sin(&qt, &kt, &pd.t, &cd.t, &snd.t, &norm, nullptr,
                                                nullptr);
    });
    check_same(with_cache, with_tables, false);
    refused(
        [&](DLTensor& qt, DLTensor& kt, DLTensor&, embrope_kv_cache_t&) {
          return embrope_apply_qk_norm_rope_cos_sin(&qt, &kt, &pd.t, &cd.t, &short_cd.t, &norm,
                                                    nullptr, nullptr);
        },
        "embrope_apply_qk_norm_rope_cos_sin", "sin");
  }
  SECTION("embrope_apply_qk_norm_rope_append_kv_cos_sin") {
    auto with_cache = run([&](DLTensor& qt, DLTensor& kt, DLTensor& vt, embrope_kv_cache_t& kv) {
      return embrope_apply_qk_norm_rope_append_kv(&qt, &kt, &vt, &pd.t, cache.handle, &kv, &norm,
                                                  nullptr, nullptr);
    });
    auto with_tables = run([&](DLTensor& qt, DLTensor& kt, DLTensor& vt, embrope_kv_cache_t& kv) {
      return embrope_apply_qk_norm_rope_append_kv_cos_sin(&qt, &kt, &vt, &pd.t, &cd.t, &snd.t, &kv,
                                                          &norm, nullptr, nullptr);
    });
    check_same(with_cache, with_tables, true);
    refused(
        [&](DLTensor& qt, DLTensor& kt, DLTensor& vt, embrope_kv_cache_t&) {
          return embrope_apply_qk_norm_rope_append_kv_cos_sin(&qt, &kt, &vt, &pd.t, &cd.t, &snd.t,
                                                              nullptr, &norm, nullptr, nullptr);
        },
        "embrope_apply_qk_norm_rope_append_kv_cos_sin", "kv is null");
  }
  SECTION("embrope_apply_qk_norm_rope_backward_cos_sin") {
    ref::Buffer grads(DType::float32, 4 * d);
    DL gq1(grads, {d}, {}, 0), gk1(grads, {d}, {}, d), gq2(grads, {d}, {}, 2 * d),
        gk2(grads, {d}, {}, 3 * d);
    auto backward = [&](DL& gq, DL& gk, bool tables) {
      embrope_qk_norm_gradients_t g;
      embrope_qk_norm_gradients_init(&g);
      g.q_weight = &gq.t;
      g.k_weight = &gk.t;
      return [&, g, tables](DLTensor& dq, DLTensor& dk, DLTensor&, embrope_kv_cache_t&) {
        // dq, dk: the outputs' gradients (random, as q and k); the saved inputs: q and k.
        ref::Buffer q_saved = q, k_saved = k;
        DL qs(q_saved, {t, hq, d}), ks(k_saved, {t, hk, d});
        return tables
                   ? embrope_apply_qk_norm_rope_backward_cos_sin(
                         &dq, &dk, &qs.t, &ks.t, &pd.t, &cd.t, &snd.t, &norm, &g, nullptr, nullptr)
                   : embrope_apply_qk_norm_rope_backward(&dq, &dk, &qs.t, &ks.t, &pd.t,
                                                         cache.handle, &norm, &g, nullptr, nullptr);
      };
    };
    auto with_cache = run(backward(gq1, gk1, false));
    auto with_tables = run(backward(gq2, gk2, true));
    check_same(with_cache, with_tables, false);
    for (std::int64_t i = 0; i < 2 * d; ++i) {
      INFO("weight gradient element " << i);
      CHECK(grads.get(i) == grads.get(2 * d + i));
    }
    CHECK(grads.get(0) != 0.0);
  }
}

// ------------------------------------------------------- binary compatibility ------------

namespace {

// apply_rope with mrope on q [4, 1, 16] (rotary 16: sections [4, 2, 2] fit both the
// contiguous and the interleaved order) and differing position streams; `options` as given.
// The call's last error is kept in `message` (the cache's destruction clears the thread's).
std::string message;
std::vector<float> mrope_rotated(const embrope_rope_options_t* options, embrope_status_t* status) {
  const CCache cache(16, 10000.0, 64);
  ref::Buffer q(DType::float32, 4 * 16), pos(DType::int64, 3 * 4);
  ref::fill_random(q, 31);
  for (std::int64_t i = 0; i < 12; ++i) pos.set(i, static_cast<double>((i * 7 + i / 4 * 5) % 60));
  DL qd(q, {4, 1, 16}), pd(pos, {3, 4});
  *status = embrope_apply_rope(&qd.t, nullptr, &pd.t, cache.handle, options, nullptr);
  message = last_error();
  std::vector<float> out(4 * 16);
  for (std::int64_t i = 0; i < 4 * 16; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<float>(q.get(i));
  return out;
}

}  // namespace

TEST_CASE("C structs of an older header are read up to struct_size, the rest defaults",
          "[c_api][abi]") {
  // A header before mrope_interleaved existed: its embrope_rope_options_t ended at that
  // field's offset (a program built with it passes that struct_size; the bytes past it are
  // not its own). Filled with 0xAB here, which as mrope_interleaved would mean "interleaved".
  const std::size_t older = offsetof(embrope_rope_options_t, mrope_interleaved);
  alignas(embrope_rope_options_t) unsigned char bytes[sizeof(embrope_rope_options_t) + 16];
  std::memset(bytes, 0xAB, sizeof bytes);
  auto* old_options = reinterpret_cast<embrope_rope_options_t*>(bytes);
  embrope_rope_options_init_size(old_options, older);
  CHECK(old_options->struct_size == older);
  for (std::size_t i = older; i < sizeof bytes; ++i) REQUIRE(bytes[i] == 0xAB);  // not written
  old_options->mrope_section[0] = 4;
  old_options->mrope_section[1] = 2;
  old_options->mrope_section[2] = 2;

  embrope_rope_options_t contiguous, interleaved;
  embrope_rope_options_init(&contiguous);
  std::copy(old_options->mrope_section, old_options->mrope_section + 3, contiguous.mrope_section);
  interleaved = contiguous;
  interleaved.mrope_interleaved = 1;
  embrope_status_t s1 = EMBROPE_OK, s2 = EMBROPE_OK, s3 = EMBROPE_OK;
  const std::vector<float> from_old = mrope_rotated(old_options, &s1);
  const std::vector<float> expected = mrope_rotated(&contiguous, &s2);
  const std::vector<float> other = mrope_rotated(&interleaved, &s3);
  REQUIRE(s1 == EMBROPE_OK);
  REQUIRE(s2 == EMBROPE_OK);
  REQUIRE(s3 == EMBROPE_OK);
  CHECK(from_old == expected);  // mrope_interleaved past the old struct: its default, 0
  CHECK(other != expected);     // (the field matters: reading the 0xAB bytes would show)
}

TEST_CASE("C structs of a newer header: zeros past the known fields, else a clear error",
          "[c_api][abi]") {
  alignas(embrope_rope_options_t) unsigned char bytes[sizeof(embrope_rope_options_t) + 16];
  std::memset(bytes, 0xAB, sizeof bytes);
  auto* newer = reinterpret_cast<embrope_rope_options_t*>(bytes);
  embrope_rope_options_init_size(newer, sizeof bytes);
  CHECK(newer->struct_size == sizeof bytes);
  for (std::size_t i = sizeof(embrope_rope_options_t); i < sizeof bytes; ++i) CHECK(bytes[i] == 0);
  embrope_status_t status = EMBROPE_OK;
  mrope_rotated(newer, &status);  // mrope off: a plain rotation of 3-row positions fails
  CHECK(status == EMBROPE_ERROR_INVALID_ARGUMENT);
  newer->mrope_section[0] = 4;
  newer->mrope_section[1] = 2;
  newer->mrope_section[2] = 2;
  mrope_rotated(newer, &status);
  CHECK(status == EMBROPE_OK);  // unknown fields all zero: accepted
  bytes[sizeof(embrope_rope_options_t) + 3] = 1;
  mrope_rotated(newer, &status);
  CHECK(status == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(message, Catch::Contains("fields set past the") &&
                          Catch::Contains("built against a newer embrope.h"));

  embrope_rope_options_t never_initialised;
  std::memset(&never_initialised, 0, sizeof never_initialised);
  mrope_rotated(&never_initialised, &status);
  CHECK(status == EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(message, Catch::Contains("options->struct_size is 0, not the size of an "
                                      "embrope.h struct: initialise the struct"));
  for (const std::size_t garbage : {std::size_t{12}, std::size_t{1} << 40}) {
    never_initialised.struct_size = garbage;  // refused before any byte past it is read
    mrope_rotated(&never_initialised, &status);
    CHECK(status == EMBROPE_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(message, Catch::Contains("struct_size is " + std::to_string(garbage)));
  }

  // A struct the library writes is written up to the caller's struct_size.
  const CCache cache(16, 10000.0, 64);
  alignas(embrope_rope_config_t) unsigned char config_bytes[sizeof(embrope_rope_config_t)];
  std::memset(config_bytes, 0xCD, sizeof config_bytes);
  auto* info = reinterpret_cast<embrope_rope_config_t*>(config_bytes);
  const std::size_t older = offsetof(embrope_rope_config_t, attention_factor);
  embrope_rope_config_init_size(info, older);
  REQUIRE(embrope_rope_cache_info(cache.handle, info, nullptr) == EMBROPE_OK);
  CHECK(info->rotary_dim == 16);
  CHECK(info->struct_size == older);
  for (std::size_t i = older; i < sizeof config_bytes; ++i) CHECK(config_bytes[i] == 0xCD);

  // A newer caller's struct: its fields past the library's are written as zero, their
  // defaults, not left as they were.
  constexpr std::size_t newer_size = sizeof(embrope_rope_config_t) + 16;
  alignas(embrope_rope_config_t) unsigned char newer_bytes[newer_size];
  auto* newer_info = reinterpret_cast<embrope_rope_config_t*>(newer_bytes);
  embrope_rope_config_init_size(newer_info, newer_size);
  std::memset(newer_bytes + sizeof(embrope_rope_config_t), 0xCD, 16);
  REQUIRE(embrope_rope_cache_info(cache.handle, newer_info, nullptr) == EMBROPE_OK);
  CHECK(newer_info->rotary_dim == 16);
  CHECK(newer_info->struct_size == newer_size);
  for (std::size_t i = sizeof(embrope_rope_config_t); i < newer_size; ++i)
    CHECK(newer_bytes[i] == 0);
}

TEST_CASE("embrope_rope_options_t of the header before float8 outputs: its padding is not read",
          "[c_api][abi]") {
  // That header's struct ended with mrope_interleaved and 4 bytes of tail padding; a C
  // compiler need not keep padding, so bytes there may hold anything.
  const std::size_t older = offsetof(embrope_rope_options_t, q_out_head_scales);
  REQUIRE(older == offsetof(embrope_rope_options_t, mrope_interleaved) + 8);
  alignas(embrope_rope_options_t) unsigned char bytes[sizeof(embrope_rope_options_t)];
  std::memset(bytes, 0xAB, sizeof bytes);
  auto* old_options = reinterpret_cast<embrope_rope_options_t*>(bytes);
  embrope_rope_options_init_size(old_options, older);
  std::memset(bytes + older - 4, 0xAB, 4);  // the old tail padding
  old_options->mrope_section[0] = 4;
  old_options->mrope_section[1] = 2;
  old_options->mrope_section[2] = 2;
  embrope_rope_options_t current;
  embrope_rope_options_init(&current);
  std::copy(old_options->mrope_section, old_options->mrope_section + 3, current.mrope_section);
  embrope_status_t s1 = EMBROPE_OK, s2 = EMBROPE_OK;
  const std::vector<float> from_old = mrope_rotated(old_options, &s1);
  INFO(message);
  REQUIRE(s1 == EMBROPE_OK);
  CHECK(from_old == mrope_rotated(&current, &s2));
  CHECK(s2 == EMBROPE_OK);
}

TEST_CASE("embrope_apply_rope with float8 outputs: scales and head scales through the C struct",
          "[c_api][float8]") {
  const std::int64_t t = 3, hq = 2, hk = 1, d = 16;
  ref::Buffer q(DType::bfloat16, t * hq * d), k(DType::bfloat16, t * hk * d), pos(DType::int64, t);
  ref::Buffer q8(DType::float8_e4m3fn, t * hq * d), k8(DType::float8_e4m3fn, t * hk * d);
  ref::Buffer q8_cpp(DType::float8_e4m3fn, t * hq * d), k8_cpp(DType::float8_e4m3fn, t * hk * d);
  ref::Buffer q_heads(DType::float32, hq), k_heads(DType::float32, hk);
  ref::fill_random(q, 41);
  ref::fill_random(k, 42);
  ref::fill_random_indices(pos, 43, 0, 31);
  q_heads.set(0, 3.0);
  q_heads.set(1, 0.5);
  k_heads.set(0, 8.0);
  const CCache cache(d, 10000.0, 32);
  DL qd(q, {t, hq, d}), kd(k, {t, hk, d}), pd(pos, {t}), q8d(q8, {t, hq, d}), k8d(k8, {t, hk, d});
  DL qhd(q_heads, {hq}), khd(k_heads, {hk});
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  CHECK(o.q_out_scale == 0.0f);  // zero, the previous behaviour: scale 1
  o.q_out = &q8d.t;
  o.k_out = &k8d.t;
  o.q_out_scale = 2.0f;
  o.k_out_scale = 0.25f;
  o.q_out_head_scales = &qhd.t;
  o.k_out_head_scales = &khd.t;
  REQUIRE(embrope_apply_rope(&qd.t, &kd.t, &pd.t, cache.handle, &o, nullptr) == EMBROPE_OK);

  // The C++ API with the same settings gives the same codes.
  embrope::RopeCache cpp_cache(embrope::RopeConfig{d, 10000.0, 32});
  embrope::RopeOptions co;
  co.q_out = ref::view(q8_cpp, 0, {t, hq, d});
  co.k_out = ref::view(k8_cpp, 0, {t, hk, d});
  co.q_out_scale = 2.0f;
  co.k_out_scale = 0.25f;
  co.q_out_head_scales = ref::view(q_heads, 0, {hq});
  co.k_out_head_scales = ref::view(k_heads, 0, {hk});
  embrope::apply_rope(ref::view(q, 0, {t, hq, d}), ref::view(k, 0, {t, hk, d}),
                      ref::view(pos, 0, {t}), cpp_cache, co);
  CHECK(q8.snapshot() == q8_cpp.snapshot());
  CHECK(k8.snapshot() == k8_cpp.snapshot());

  // A zero scale is 1; a negative one is refused by name.
  o.q_out_head_scales = nullptr;
  o.k_out_head_scales = nullptr;
  o.q_out_scale = 0.0f;
  o.k_out_scale = 0.0f;
  REQUIRE(embrope_apply_rope(&qd.t, &kd.t, &pd.t, cache.handle, &o, nullptr) == EMBROPE_OK);
  co.q_out_head_scales.reset();
  co.k_out_head_scales.reset();
  co.q_out_scale = co.k_out_scale = 1.0f;
  embrope::apply_rope(ref::view(q, 0, {t, hq, d}), ref::view(k, 0, {t, hk, d}),
                      ref::view(pos, 0, {t}), cpp_cache, co);
  CHECK(q8.snapshot() == q8_cpp.snapshot());
  o.q_out_scale = -1.0f;
  CHECK(embrope_apply_rope(&qd.t, &kd.t, &pd.t, cache.handle, &o, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("embrope_apply_rope") &&
                               Catch::Contains("q_out_scale") && Catch::Contains("positive"));
}

TEST_CASE("embrope_apply_rope float8 outputs with q_nope / k_nope through the C struct",
          "[c_api][float8]") {
  // MLA-shaped: the non-rotary parts quantized in the same call equal the C++ API's bytes;
  // a struct of the header before these fields (cut at q_nope, the bytes past it set)
  // quantizes no non-rotary part.
  const std::int64_t t = 3, hq = 2, r = 16, nope = 8, rank = 12;
  ref::Buffer q(DType::bfloat16, t * hq * r), k(DType::bfloat16, t * r),
      qn(DType::bfloat16, t * hq * nope), kn(DType::bfloat16, t * rank), pos(DType::int64, t);
  ref::Buffer q8(DType::float8_e5m2, t * hq * r), k8(DType::float8_e5m2, t * r),
      qn8(DType::float8_e5m2, t * hq * nope), kn8(DType::float8_e5m2, t * rank);
  for (ref::Buffer* b : {&q, &k, &qn, &kn}) ref::fill_random(*b, 51 + b->size());
  ref::fill_random_indices(pos, 55, 0, 31);
  const CCache cache(r, 10000.0, 32);
  DL qd(q, {t, hq, r}), kd(k, {t, 1, r}), pd(pos, {t}), q8d(q8, {t, hq, r}), k8d(k8, {t, 1, r});
  DL qnd(qn, {t, hq, nope}), knd(kn, {t, 1, rank}), qn8d(qn8, {t, hq, nope}),
      kn8d(kn8, {t, 1, rank});
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  CHECK(o.q_nope == nullptr);
  CHECK(o.k_nope_out == nullptr);
  o.q_out = &q8d.t;
  o.k_out = &k8d.t;
  o.q_out_scale = 4.0f;
  o.q_nope = &qnd.t;
  o.q_nope_out = &qn8d.t;
  o.k_nope = &knd.t;
  o.k_nope_out = &kn8d.t;
  REQUIRE(embrope_apply_rope(&qd.t, &kd.t, &pd.t, cache.handle, &o, nullptr) == EMBROPE_OK);

  ref::Buffer q8c = q8, k8c = k8, qn8c = qn8, kn8c = kn8;
  for (ref::Buffer* b : {&q8c, &k8c, &qn8c, &kn8c}) ref::poison(*b);
  embrope::RopeCache cpp_cache(embrope::RopeConfig{r, 10000.0, 32});
  embrope::RopeOptions co;
  co.q_out = ref::view(q8c, 0, {t, hq, r});
  co.k_out = ref::view(k8c, 0, {t, 1, r});
  co.q_out_scale = 4.0f;
  co.q_nope = ref::view(qn, 0, {t, hq, nope});
  co.q_nope_out = ref::view(qn8c, 0, {t, hq, nope});
  co.k_nope = ref::view(kn, 0, {t, 1, rank});
  co.k_nope_out = ref::view(kn8c, 0, {t, 1, rank});
  embrope::apply_rope(ref::view(q, 0, {t, hq, r}), ref::view(k, 0, {t, 1, r}),
                      ref::view(pos, 0, {t}), cpp_cache, co);
  CHECK(q8.snapshot() == q8c.snapshot());
  CHECK(k8.snapshot() == k8c.snapshot());
  CHECK(qn8.snapshot() == qn8c.snapshot());
  CHECK(kn8.snapshot() == kn8c.snapshot());

  // The older header's struct: the fields past its size are not read (0xAB there).
  const std::size_t older = offsetof(embrope_rope_options_t, q_nope);
  alignas(embrope_rope_options_t) unsigned char bytes[sizeof(embrope_rope_options_t)];
  std::memset(bytes, 0xAB, sizeof bytes);
  auto* old_options = reinterpret_cast<embrope_rope_options_t*>(bytes);
  embrope_rope_options_init_size(old_options, older);
  old_options->q_out = &q8d.t;
  old_options->k_out = &k8d.t;
  ref::poison(qn8);
  const ref::Buffer untouched = qn8;
  REQUIRE(embrope_apply_rope(&qd.t, &kd.t, &pd.t, cache.handle, old_options, nullptr) ==
          EMBROPE_OK);
  CHECK(qn8.snapshot() == untouched.snapshot());
}
