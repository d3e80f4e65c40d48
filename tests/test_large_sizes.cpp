// Tables and tensors past 2^31 elements (docs/ops.md, "Tensors": offsets are computed in 64
// bits), on the CPU, without allocating that much: a large range of address space is reserved
// with mmap(MAP_NORESERVE) and only the pages of the rows a call touches become resident.
// Where the address space cannot be reserved (a ulimit -v, vm.overcommit_memory = 2) a test
// says so and checks nothing: it is a statement about this machine, not a pass.
//
// Expected values come from the row numbers through a formula written here, so a 32-bit
// wrap of any offset (row 2^32 read as row 0, a stride product truncated) reads another row,
// or an unwritten zero page, and fails.
#include <catch2/catch.hpp>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "embrope/embrope.hpp"

namespace {

using embrope::DType;
using embrope::Tensor;

constexpr std::int64_t k2p31 = std::int64_t{1} << 31;
constexpr std::int64_t k2p32 = std::int64_t{1} << 32;

// A reserved, zero-filled range of address space; pages are backed when first written.
class Reservation {
 public:
  explicit Reservation(std::size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) base_ = static_cast<float*>(p);
  }
  ~Reservation() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  float* data() const { return base_; }
  // Says why the test checks nothing, when the reservation failed.
  bool unavailable() const {
    if (base_ != nullptr) return false;
    std::printf("large sizes: cannot reserve %.1f GiB of address space here: not checked\n",
                static_cast<double>(bytes_) / (1u << 30));
    WARN("cannot reserve " << bytes_ << " bytes of address space: this test checks nothing here");
    return true;
  }

 private:
  std::size_t bytes_;
  float* base_ = nullptr;
};

// A small integer (exact in float32) that identifies row r and column j.
float row_value(std::int64_t r, std::int64_t j) {
  return static_cast<float>((r % 8191) * 8 + j + 1);
}

}  // namespace

TEST_CASE("embed: vocabularies past 2^32 rows, ids near 2^31 and 2^32", "[large][embed]") {
  constexpr std::int64_t D = 4;
  const std::int64_t vocab = k2p32 + 16;
  Reservation table_memory(static_cast<std::size_t>(vocab * D) * sizeof(float));
  if (table_memory.unavailable()) return;
  float* table = table_memory.data();
  const std::vector<std::int64_t> rows = {0,         k2p31 - 1, k2p31,     k2p31 + 1,
                                          k2p32 - 1, k2p32,     k2p32 + 15};
  for (std::int64_t r : rows) {
    for (std::int64_t j = 0; j < D; ++j) table[r * D + j] = row_value(r, j);
  }
  const auto n = static_cast<std::int64_t>(rows.size());
  std::vector<std::int64_t> ids(rows);
  std::vector<float> out(static_cast<std::size_t>(n * D), -1.0f);
  embrope::embed(Tensor(table, DType::float32, {vocab, D}), Tensor(ids.data(), DType::int64, {n}),
                 Tensor(out.data(), DType::float32, {n, D}));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < D; ++j) {
      INFO("id " << rows[i] << " column " << j);
      CHECK(out[i * D + j] == row_value(rows[i], j));
    }
  }

  SECTION("int32 ids up to INT32_MAX") {
    std::vector<std::int32_t> ids32 = {INT32_MAX, 0, INT32_MAX - 1};
    table[(k2p31 - 2) * D] = 42.0f;
    std::vector<float> o(3 * D, -1.0f);
    embrope::embed(Tensor(table, DType::float32, {vocab, D}),
                   Tensor(ids32.data(), DType::int32, {3}),
                   Tensor(o.data(), DType::float32, {3, D}));
    CHECK(o[0] == row_value(k2p31 - 1, 0));
    CHECK(o[D] == row_value(0, 0));
    CHECK(o[2 * D] == 42.0f);
  }

  SECTION("a vocab shard starting past 2^32") {
    embrope::EmbedOptions o;
    o.vocab_start = k2p32;
    o.vocab_shard = true;
    std::vector<std::int64_t> shard_ids = {k2p32 + k2p31, k2p32 + 5, 3, k2p32 + k2p32 + 15};
    std::vector<float> got(4 * D, -1.0f);
    embrope::embed(Tensor(table, DType::float32, {vocab, D}),
                   Tensor(shard_ids.data(), DType::int64, {4}),
                   Tensor(got.data(), DType::float32, {4, D}), o);
    for (std::int64_t j = 0; j < D; ++j) {
      CHECK(got[j] == row_value(k2p31, j));  // id 2^32 + 2^31 is row 2^31 of the shard
      CHECK(got[D + j] == 0.0f);             // row 5: never written, a zero page
      CHECK(got[2 * D + j] == 0.0f);         // below the shard
      CHECK(got[3 * D + j] == row_value(k2p32 + 15, j));
    }
  }

  SECTION("an id one past the vocabulary is reported, not read") {
    std::vector<std::int64_t> bad = {vocab};
    std::vector<float> o(D, -1.0f);
    CHECK_THROWS_WITH(embrope::embed(Tensor(table, DType::float32, {vocab, D}),
                                     Tensor(bad.data(), DType::int64, {1}),
                                     Tensor(o.data(), DType::float32, {1, D})),
                      Catch::Contains("ids[0] = " + std::to_string(vocab)));
  }
}

TEST_CASE("embed: row strides past 2^31 in the table, the output and the position table",
          "[large][embed]") {
  constexpr std::int64_t D = 4, V = 8, N = 5;
  const std::int64_t table_stride = k2p31 + 3;  // elements; row 7 starts past 2^34 elements
  const std::int64_t out_stride = k2p31 + 5;
  const std::int64_t pos_rows = k2p31 + 8;
  Reservation table_memory(static_cast<std::size_t>((V - 1) * table_stride + D) * sizeof(float));
  Reservation out_memory(static_cast<std::size_t>((N - 1) * out_stride + D) * sizeof(float));
  Reservation pos_memory(static_cast<std::size_t>(pos_rows * D) * sizeof(float));
  if (table_memory.unavailable() || out_memory.unavailable() || pos_memory.unavailable()) return;
  float* table = table_memory.data();
  float* out = out_memory.data();
  float* pos = pos_memory.data();
  for (std::int64_t r = 0; r < V; ++r) {
    for (std::int64_t j = 0; j < D; ++j) table[r * table_stride + j] = row_value(r, j);
  }
  // Learned positions near 2^31, explicit and implicit (offset + s crosses 2^31).
  const std::vector<std::int64_t> ids = {7, 0, 5, 7, 3};
  const std::vector<std::int64_t> positions = {k2p31 - 2, k2p31 - 1, k2p31, k2p31 + 1, k2p31 + 7};
  for (std::int64_t p : positions) {
    for (std::int64_t j = 0; j < D; ++j) pos[p * D + j] = 1000.0f * row_value(p, j);
  }
  const Tensor t(table, DType::float32, {V, D}, {table_stride, 1});
  const Tensor o(out, DType::float32, {N, D}, {out_stride, 1});

  SECTION("explicit position ids") {
    std::vector<std::int64_t> ids_copy(ids), pos_ids(positions);
    embrope::EmbedOptions opt;
    opt.positions = embrope::PositionEncoding::learned;
    opt.position_table = Tensor(pos, DType::float32, {pos_rows, D});
    opt.position_ids = Tensor(pos_ids.data(), DType::int64, {N});
    embrope::embed(t, Tensor(ids_copy.data(), DType::int64, {N}), o, opt);
  }
  SECTION("implicit positions: offset 2^31 - 2 plus s") {
    std::vector<std::int64_t> ids_copy(ids), offsets = {k2p31 - 2};
    embrope::EmbedOptions opt;
    opt.positions = embrope::PositionEncoding::learned;
    opt.position_table = Tensor(pos, DType::float32, {pos_rows, D});
    opt.position_offsets = Tensor(offsets.data(), DType::int64, {1});
    // ids [1, N]: positions 2^31 - 2 + s for s < N; s = 4 is 2^31 + 2, so write that row too.
    for (std::int64_t j = 0; j < D; ++j)
      pos[(k2p31 + 2) * D + j] = 1000.0f * row_value(k2p31 + 2, j);
    embrope::embed(t, Tensor(ids_copy.data(), DType::int64, {1, N}),
                   Tensor(out, DType::float32, {1, N, D}, {0, out_stride, 1}), opt);
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t j = 0; j < D; ++j) {
        const std::int64_t p = k2p31 - 2 + n;
        INFO("row " << n << " column " << j);
        CHECK(out[n * out_stride + j] == row_value(ids[n], j) + 1000.0f * row_value(p, j));
      }
    }
    return;
  }
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t j = 0; j < D; ++j) {
      INFO("row " << n << " column " << j);
      CHECK(out[n * out_stride + j] == row_value(ids[n], j) + 1000.0f * row_value(positions[n], j));
    }
  }
}

TEST_CASE("apply_rope: cos/sin tables past 2^31 positions, token strides past 2^31",
          "[large][rope]") {
  constexpr std::int64_t D = 8, R = 8, H = 2, T = 4;
  const std::int64_t rows = k2p31 + 64;
  const std::int64_t token_stride = k2p31 + 16;  // elements between tokens of q
  Reservation cos_memory(static_cast<std::size_t>(rows * R / 2) * sizeof(float));
  Reservation sin_memory(static_cast<std::size_t>(rows * R / 2) * sizeof(float));
  Reservation q_memory(static_cast<std::size_t>((T - 1) * token_stride + H * D) * sizeof(float));
  if (cos_memory.unavailable() || sin_memory.unavailable() || q_memory.unavailable()) return;
  float* cos = cos_memory.data();
  float* sin = sin_memory.data();
  float* q = q_memory.data();

  // Exact float32 cos/sin per row: a rotation by the Pythagorean triple (3/5, 4/5), scaled
  // by a row-dependent power of two, so the expected result is easy to compute exactly.
  auto scale_of = [](std::int64_t p) { return std::ldexp(1.0, static_cast<int>(p % 5)); };
  const std::vector<std::int64_t> positions = {k2p31 + 5, k2p31 - 1, 3, k2p31 + 63};
  for (std::int64_t p : positions) {
    for (std::int64_t i = 0; i < R / 2; ++i) {
      cos[p * (R / 2) + i] = static_cast<float>(0.6 * scale_of(p));
      sin[p * (R / 2) + i] = static_cast<float>(0.8 * scale_of(p));
    }
  }
  std::vector<float> q_in(static_cast<std::size_t>(T * H * D));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t e = 0; e < H * D; ++e) {
      const float v = static_cast<float>((t * 31 + e * 7) % 17 - 8);  // small integers
      q_in[t * H * D + e] = v;
      q[t * token_stride + e] = v;
    }
  }
  std::vector<std::int64_t> pos(positions);
  embrope::apply_rope(Tensor(q, DType::float32, {T, H, D}, {token_stride, D, 1}), std::nullopt,
                      Tensor(pos.data(), DType::int64, {T}),
                      Tensor(cos, DType::float32, {rows, R / 2}),
                      Tensor(sin, DType::float32, {rows, R / 2}));
  for (std::int64_t t = 0; t < T; ++t) {
    const double c = 0.6 * scale_of(positions[t]), s = 0.8 * scale_of(positions[t]);
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < R / 2; ++i) {
        const double a = q_in[t * H * D + h * D + i], b = q_in[t * H * D + h * D + i + R / 2];
        // cos and sin are float32 roundings of 0.6 and 0.8 times a power of two.
        const double cf = static_cast<float>(c), sf = static_cast<float>(s);
        const double want_a = a * cf - b * sf, want_b = a * sf + b * cf;
        const double tol = 1e-6 * (std::fabs(a) + std::fabs(b)) * scale_of(positions[t]) + 1e-30;
        INFO("token " << t << " head " << h << " pair " << i);
        CHECK(std::fabs(q[t * token_stride + h * D + i] - want_a) <= tol);
        CHECK(std::fabs(q[t * token_stride + h * D + i + R / 2] - want_b) <= tol);
      }
    }
  }

  SECTION("int32 position INT32_MAX and a position one past the table") {
    std::vector<std::int32_t> p32 = {INT32_MAX};
    for (std::int64_t i = 0; i < R / 2; ++i) {
      cos[(k2p31 - 1) * (R / 2) + i] = 1.0f;  // identity rotation at 2^31 - 1
      sin[(k2p31 - 1) * (R / 2) + i] = 0.0f;
    }
    std::vector<float> x(H * D, 3.0f);
    embrope::apply_rope(Tensor(x.data(), DType::float32, {1, H, D}), std::nullopt,
                        Tensor(p32.data(), DType::int32, {1}),
                        Tensor(cos, DType::float32, {rows, R / 2}),
                        Tensor(sin, DType::float32, {rows, R / 2}));
    for (float v : x) CHECK(v == 3.0f);
    std::vector<std::int64_t> past = {rows};
    CHECK_THROWS_WITH(embrope::apply_rope(Tensor(x.data(), DType::float32, {1, H, D}), std::nullopt,
                                          Tensor(past.data(), DType::int64, {1}),
                                          Tensor(cos, DType::float32, {rows, R / 2}),
                                          Tensor(sin, DType::float32, {rows, R / 2})),
                      Catch::Contains("positions[0] = " + std::to_string(rows)));
  }
}

TEST_CASE("apply_rope: [B, S, H, D] with a batch stride past 2^32 elements", "[large][rope]") {
  constexpr std::int64_t B = 3, S = 2, H = 1, D = 4, R = 4, P = 8;
  const std::int64_t batch_stride = k2p32 + 12;
  Reservation q_memory(static_cast<std::size_t>((B - 1) * batch_stride + S * H * D) *
                       sizeof(float));
  if (q_memory.unavailable()) return;
  float* q = q_memory.data();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t e = 0; e < S * H * D; ++e) q[b * batch_stride + e] = row_value(b, e);
  }
  // A quarter turn: (a, b) -> (-b, a), exact in float32.
  std::vector<float> cos(P * R / 2, 0.0f), sin(P * R / 2, 1.0f);
  std::vector<std::int64_t> pos = {1, 2, 3, 4, 5, 6};
  embrope::apply_rope(Tensor(q, DType::float32, {B, S, H, D}, {batch_stride, H * D, D, 1}),
                      std::nullopt, Tensor(pos.data(), DType::int64, {B, S}),
                      Tensor(cos.data(), DType::float32, {P, R / 2}),
                      Tensor(sin.data(), DType::float32, {P, R / 2}));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t e = s * H * D;
      INFO("batch " << b << " token " << s);
      CHECK(q[b * batch_stride + e + 0] == -row_value(b, e + 2));
      CHECK(q[b * batch_stride + e + 1] == -row_value(b, e + 3));
      CHECK(q[b * batch_stride + e + 2] == row_value(b, e + 0));
      CHECK(q[b * batch_stride + e + 3] == row_value(b, e + 1));
    }
  }
}
