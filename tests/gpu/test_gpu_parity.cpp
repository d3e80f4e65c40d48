// Every op on the GPU against the CPU path (the oracle, itself tested against float64
// references): float32 within 1e-6 relative to the row norm, float16/bfloat16 within one
// output ulp. Outputs are poisoned before each call.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "embrope/detail/numeric_types.hpp"

namespace {

using embrope::Device;
using embrope::DType;
using embrope::Tensor;

void cuda_check(cudaError_t e) {
  REQUIRE(e == cudaSuccess);
}

// A host buffer and its device twin.
struct Buffer {
  std::vector<unsigned char> host;
  void* device = nullptr;
  explicit Buffer(std::size_t bytes) : host(bytes) {
    cuda_check(cudaMalloc(&device, bytes == 0 ? 1 : bytes));
  }
  ~Buffer() { cudaFree(device); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void upload() {
    cuda_check(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(host.size());
    cuda_check(cudaMemcpy(out.data(), device, host.size(), cudaMemcpyDeviceToHost));
    return out;
  }
  void poison_both(unsigned char byte) {
    std::memset(host.data(), byte, host.size());
    cuda_check(cudaMemset(device, byte, host.size()));
  }
};

float load_value(const unsigned char* base, DType dtype, std::int64_t i) {
  if (dtype == DType::float32) {
    float v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, base + 2 * i, 2);
  return dtype == DType::float16 ? embrope::detail::half_to_float(bits)
                                 : embrope::detail::bfloat16_to_float(bits);
}

void store_value(unsigned char* base, DType dtype, std::int64_t i, float v) {
  if (dtype == DType::float32) {
    std::memcpy(base + 4 * i, &v, 4);
    return;
  }
  const std::uint16_t bits = dtype == DType::float16 ? embrope::detail::float_to_half(v)
                                                     : embrope::detail::float_to_bfloat16(v);
  std::memcpy(base + 2 * i, &bits, 2);
}

void fill_random(Buffer& b, DType dtype, std::int64_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < count; ++i) store_value(b.host.data(), dtype, i, u(rng));
}

// Compares rows of `dim` elements: GPU output against CPU output.
void compare_rows(const std::vector<unsigned char>& gpu, const std::vector<unsigned char>& cpu,
                  DType dtype, std::int64_t count, std::int64_t dim) {
  for (std::int64_t row = 0; row * dim < count; ++row) {
    double norm = 0;
    for (std::int64_t j = 0; j < dim; ++j) {
      const double v = load_value(cpu.data(), dtype, row * dim + j);
      norm += v * v;
    }
    norm = std::sqrt(norm);
    for (std::int64_t j = 0; j < dim; ++j) {
      const float g = load_value(gpu.data(), dtype, row * dim + j);
      const float c = load_value(cpu.data(), dtype, row * dim + j);
      INFO("row " << row << " element " << j << " gpu " << g << " cpu " << c);
      REQUIRE(std::isfinite(g) == std::isfinite(c));
      if (dtype == DType::float32) {
        REQUIRE(std::fabs(g - c) <= 1e-6 * (norm + 1e-30) + 1e-30);
      } else {
        // one ulp of the output dtype at the larger magnitude
        const int mantissa = dtype == DType::float16 ? 10 : 7;
        const float m = std::fmax(std::fabs(g), std::fabs(c));
        const float ulp = m == 0 ? 0 : std::ldexp(1.0f, std::ilogb(m) - mantissa);
        REQUIRE(std::fabs(g - c) <= ulp + 1e-7f);
      }
    }
  }
}

struct RopeCase {
  DType dtype;
  embrope::RopeLayout layout;
  std::int64_t head_dim, rotary_dim, hq, hk, tokens;
  bool strided, in_place;
};

void run_rope_case(const RopeCase& c) {
  INFO("dtype " << embrope::dtype_name(c.dtype) << " layout " << static_cast<int>(c.layout) << " D "
                << c.head_dim << " R " << c.rotary_dim << " Hq " << c.hq << " Hk " << c.hk << " T "
                << c.tokens << " strided " << c.strided << " in_place " << c.in_place);
  const int es = embrope::dtype_size(c.dtype);
  // Strided: q and k are views into one fused [T, Hq + Hk + Hk, D + pad] buffer.
  const std::int64_t pad = c.strided ? 8 : 0;
  const std::int64_t row = c.head_dim + pad;
  const std::int64_t token_stride = (c.hq + 2 * c.hk) * row;
  const std::int64_t elements = c.tokens * token_stride;
  Buffer qkv(elements * es), out(elements * es), pos(c.tokens * 8);
  fill_random(qkv, c.dtype, elements, 1234 + c.tokens * 7 + c.head_dim);
  const std::int64_t max_positions = 5000;
  std::mt19937_64 rng(99);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    const std::int64_t p = static_cast<std::int64_t>(rng() % max_positions);
    std::memcpy(pos.host.data() + 8 * t, &p, 8);
  }
  qkv.upload();
  pos.upload();
  out.poison_both(0xff);

  embrope::RopeCache cpu_cache({c.rotary_dim, 10000.0, max_positions});
  embrope::RopeCache gpu_cache({c.rotary_dim, 10000.0, max_positions}, Device::cuda(0));

  auto views = [&](void* base, void* out_base, Device d, embrope::RopeOptions& o) {
    Tensor q(base, c.dtype, {c.tokens, c.hq, c.head_dim}, {token_stride, row, 1}, d);
    Tensor k(static_cast<unsigned char*>(base) + c.hq * row * es, c.dtype,
             {c.tokens, c.hk, c.head_dim}, {token_stride, row, 1}, d);
    if (!c.in_place) {
      o.q_out = Tensor(out_base, c.dtype, {c.tokens, c.hq, c.head_dim}, {token_stride, row, 1}, d);
      o.k_out = Tensor(static_cast<unsigned char*>(out_base) + c.hq * row * es, c.dtype,
                       {c.tokens, c.hk, c.head_dim}, {token_stride, row, 1}, d);
    }
    return std::make_pair(q, k);
  };
  embrope::RopeOptions cpu_opts, gpu_opts;
  cpu_opts.layout = gpu_opts.layout = c.layout;
  auto [cq, ck] = views(qkv.host.data(), out.host.data(), Device::cpu(), cpu_opts);
  auto [gq, gk] = views(qkv.device, out.device, Device::cuda(0), gpu_opts);
  embrope::apply_rope(cq, ck, Tensor(pos.host.data(), DType::int64, {c.tokens}), cpu_cache,
                      cpu_opts);
  embrope::apply_rope(gq, gk, Tensor(pos.device, DType::int64, {c.tokens}, Device::cuda(0)),
                      gpu_cache, gpu_opts);
  cuda_check(cudaDeviceSynchronize());
  const Buffer& result = c.in_place ? qkv : out;
  compare_rows(result.download(), result.host, c.dtype, elements, row);
}

}  // namespace

TEST_CASE("GPU cache equals CPU cache within one float32 ulp", "[gpu][rope_cache]") {
  for (std::int64_t r : {2, 64, 128, 256}) {
    const embrope::RopeConfig config{r, 500000.0, 70000};
    embrope::RopeCache cpu(config);
    embrope::RopeCache gpu(config, Device::cuda(0));
    const std::size_t n = static_cast<std::size_t>(config.max_positions * r / 2);
    std::vector<float> cc(n), cs(n), gc(n), gs(n);
    cpu.copy_to_host(cc.data(), cs.data());
    gpu.copy_to_host(gc.data(), gs.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(std::fabs(cc[i] - gc[i]) <=
              std::nextafter(std::fabs(cc[i]), 2.0f) - std::fabs(cc[i]));
      REQUIRE(std::fabs(cs[i] - gs[i]) <=
              std::nextafter(std::fabs(cs[i]), 2.0f) - std::fabs(cs[i]));
      differ += (cc[i] != gc[i]) + (cs[i] != gs[i]);
    }
    WARN("rotary_dim " << r << ": " << differ << " of " << 2 * n << " values differ by one ulp");
  }
}

TEST_CASE("GPU RoPE equals CPU RoPE over the grid", "[gpu][rope][sweep]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
      for (std::int64_t d : {64, 80, 96, 128, 256}) {
        for (bool partial : {false, true}) {
          for (auto heads : {std::pair<std::int64_t, std::int64_t>{32, 8}, {7, 1}, {1, 1}}) {
            for (std::int64_t tokens : {1, 3, 64, 4097}) {
              for (bool strided : {false, true}) {
                for (bool in_place : {true, false}) {
                  if (tokens == 4097 && (heads.first != 32 || d != 128)) continue;  // time
                  run_rope_case({dtype, layout, d, partial ? d / 2 : d, heads.first, heads.second,
                                 tokens, strided, in_place});
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("GPU bad positions: rows zero-filled, error names the first, context usable",
          "[gpu][rope][errors]") {
  const std::int64_t tokens = 100, heads = 4, dim = 64;
  Buffer q(tokens * heads * dim * 4), pos(tokens * 8);
  fill_random(q, DType::float32, tokens * heads * dim, 5);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t p = (t == 37 || t == 90) ? 4096 + t : t;
    std::memcpy(pos.host.data() + 8 * t, &p, 8);
  }
  q.upload();
  pos.upload();
  embrope::RopeCache cache({dim, 10000.0, 4096}, Device::cuda(0));
  const Tensor gq(q.device, DType::float32, {tokens, heads, dim}, Device::cuda(0));
  const Tensor gp(pos.device, DType::int64, {tokens}, Device::cuda(0));
  REQUIRE_THROWS_WITH(embrope::apply_rope(gq, std::nullopt, gp, cache),
                      Catch::Contains("positions[37] = 4133"));
  const auto result = q.download();
  for (std::int64_t j = 0; j < heads * dim; ++j) {
    REQUIRE(load_value(result.data(), DType::float32, 37 * heads * dim + j) == 0.0f);
    REQUIRE(load_value(result.data(), DType::float32, 90 * heads * dim + j) == 0.0f);
  }
  // Deferred policy, then a correct call on the same context.
  embrope::DeferredStatus status(Device::cuda(0));
  embrope::RopeOptions options;
  options.deferred = &status;
  embrope::apply_rope(gq, std::nullopt, gp, cache, options);
  REQUIRE_FALSE(status.ok());
  REQUIRE_THROWS_WITH(status.check(), Catch::Contains("positions[37]"));
  REQUIRE(status.ok());
  for (std::int64_t t = 0; t < tokens; ++t) std::memcpy(pos.host.data() + 8 * t, &t, 8);
  pos.upload();
  q.upload();
  embrope::apply_rope(gq, std::nullopt, gp, cache);
  embrope::RopeCache cpu_cache({dim, 10000.0, 4096});
  embrope::apply_rope(Tensor(q.host.data(), DType::float32, {tokens, heads, dim}), std::nullopt,
                      Tensor(pos.host.data(), DType::int64, {tokens}), cpu_cache);
  compare_rows(q.download(), q.host, DType::float32, tokens * heads * dim, dim);
}

TEST_CASE("GPU embed equals CPU embed", "[gpu][embed]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto positions : {embrope::PositionEncoding::none, embrope::PositionEncoding::learned,
                           embrope::PositionEncoding::sinusoidal}) {
      for (std::int64_t dim : {8, 100, 4096}) {
        INFO("dtype " << embrope::dtype_name(dtype) << " positions " << static_cast<int>(positions)
                      << " D " << dim);
        const std::int64_t vocab = 1000, batch = 3, seq = 37, max_pos = 512, types = 2;
        const int es = embrope::dtype_size(dtype);
        Buffer table(vocab * dim * es), ptable(max_pos * dim * es), ttable(types * dim * es);
        Buffer ids(batch * seq * 4), tids(batch * seq * 8), offsets(batch * 8);
        Buffer out(batch * seq * dim * es);
        fill_random(table, dtype, vocab * dim, 1);
        fill_random(ptable, dtype, max_pos * dim, 2);
        fill_random(ttable, dtype, types * dim, 3);
        std::mt19937_64 rng(4);
        for (std::int64_t n = 0; n < batch * seq; ++n) {
          const std::int32_t id = static_cast<std::int32_t>(rng() % vocab);
          const std::int64_t tid = static_cast<std::int64_t>(rng() % types);
          std::memcpy(ids.host.data() + 4 * n, &id, 4);
          std::memcpy(tids.host.data() + 8 * n, &tid, 8);
        }
        for (std::int64_t b = 0; b < batch; ++b) {
          const std::int64_t o = 100 * b;
          std::memcpy(offsets.host.data() + 8 * b, &o, 8);
        }
        for (Buffer* b : {&table, &ptable, &ttable, &ids, &tids, &offsets}) b->upload();
        out.poison_both(0xff);
        auto run = [&](bool gpu) {
          const Device d = gpu ? Device::cuda(0) : Device::cpu();
          auto ptr = [&](Buffer& b) -> void* { return gpu ? b.device : b.host.data(); };
          embrope::EmbedOptions o;
          o.scale = 1.5f;
          o.positions = positions;
          if (positions == embrope::PositionEncoding::learned) {
            o.position_table = Tensor(ptr(ptable), dtype, {max_pos, dim}, d);
          }
          if (positions != embrope::PositionEncoding::none) {
            o.position_offsets = Tensor(ptr(offsets), DType::int64, {batch}, d);
          }
          o.type_table = Tensor(ptr(ttable), dtype, {types, dim}, d);
          o.type_ids = Tensor(ptr(tids), DType::int64, {batch, seq}, d);
          embrope::embed(Tensor(ptr(table), dtype, {vocab, dim}, d),
                         Tensor(ptr(ids), DType::int32, {batch, seq}, d),
                         Tensor(ptr(out), dtype, {batch, seq, dim}, d), o);
        };
        run(false);
        run(true);
        cuda_check(cudaDeviceSynchronize());
        compare_rows(out.download(), out.host, dtype, batch * seq * dim, dim);
      }
    }
  }
}

TEST_CASE("GPU embed: bad ids zero their rows, the error names the first, context usable",
          "[gpu][embed][errors]") {
  const std::int64_t vocab = 50, dim = 64, rows = 1000;
  Buffer table(vocab * dim * 4), ids(rows * 8), out(rows * dim * 4);
  fill_random(table, DType::float32, vocab * dim, 11);
  for (std::int64_t n = 0; n < rows; ++n) {
    const std::int64_t id = n == 611 ? -3 : (n == 900 ? vocab : n % vocab);
    std::memcpy(ids.host.data() + 8 * n, &id, 8);
  }
  table.upload();
  ids.upload();
  out.poison_both(0xff);
  const Device gpu = Device::cuda(0);
  const Tensor tt(table.device, DType::float32, {vocab, dim}, gpu);
  const Tensor ti(ids.device, DType::int64, {rows}, gpu);
  const Tensor to(out.device, DType::float32, {rows, dim}, gpu);
  REQUIRE_THROWS_WITH(embrope::embed(tt, ti, to), Catch::Contains("ids[611] = -3"));
  embrope::embed(Tensor(table.host.data(), DType::float32, {vocab, dim}),
                 Tensor(ids.host.data(), DType::int64, {rows}),
                 Tensor(out.host.data(), DType::float32, {rows, dim}), [] {
                   embrope::EmbedOptions o;
                   o.vocab_shard = true;  // CPU oracle for the good rows; bad rows are zero
                   return o;
                 }());
  compare_rows(out.download(), out.host, DType::float32, rows * dim, dim);
  // Vocab-parallel shard on the GPU: the same ids are no error.
  embrope::EmbedOptions shard;
  shard.vocab_shard = true;
  embrope::embed(tt, ti, to, shard);
  compare_rows(out.download(), out.host, DType::float32, rows * dim, dim);
}

TEST_CASE("GPU ids and positions at the int32/int64 limits, then the other op on the context",
          "[gpu][errors]") {
  // Each extreme value alone in an otherwise good call: the call fails naming it, its row
  // is zero, nothing outside the tensors is touched (compute-sanitizer memcheck in
  // scripts/gpu-check.sh), and the next call of the other op on the same context is exact.
  const std::int64_t vocab = 64, dim = 64, rows = 256, heads = 2, max_pos = 128;
  const Device gpu = Device::cuda(0);
  Buffer table(vocab * dim * 4), ids(rows * 8), ids32(rows * 4), out(rows * dim * 4);
  Buffer q(rows * heads * dim * 4), pos(rows * 8);
  fill_random(table, DType::float32, vocab * dim, 21);
  fill_random(q, DType::float32, rows * heads * dim, 22);
  table.upload();
  embrope::RopeCache cache({dim, 10000.0, max_pos}, gpu);
  embrope::RopeCache cpu_cache({dim, 10000.0, max_pos});
  auto set_all = [&](std::int64_t bad_row, std::int64_t bad) {
    for (std::int64_t n = 0; n < rows; ++n) {
      const std::int64_t v = n == bad_row ? bad : n % vocab;
      const auto v32 = static_cast<std::int32_t>(v);
      std::memcpy(ids.host.data() + 8 * n, &v, 8);
      std::memcpy(ids32.host.data() + 4 * n, &v32, 4);
      std::memcpy(pos.host.data() + 8 * n, &v, 8);
    }
    ids.upload();
    ids32.upload();
    pos.upload();
  };
  const std::int64_t extremes[] = {
      INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX, std::int64_t{1} << 32, -1};
  for (std::int64_t bad : extremes) {
    INFO("bad value " << bad);
    set_all(77, bad);
    const bool fits32 = bad >= INT32_MIN && bad <= INT32_MAX;
    out.poison_both(0xff);
    REQUIRE_THROWS_WITH(embrope::embed(Tensor(table.device, DType::float32, {vocab, dim}, gpu),
                                       Tensor(ids.device, DType::int64, {rows}, gpu),
                                       Tensor(out.device, DType::float32, {rows, dim}, gpu)),
                        Catch::Contains("ids[77] = " + std::to_string(bad)));
    const auto result = out.download();
    for (std::int64_t j = 0; j < dim; ++j) {
      REQUIRE(load_value(result.data(), DType::float32, 77 * dim + j) == 0.0f);
    }
    if (fits32) {
      REQUIRE_THROWS_WITH(embrope::embed(Tensor(table.device, DType::float32, {vocab, dim}, gpu),
                                         Tensor(ids32.device, DType::int32, {rows}, gpu),
                                         Tensor(out.device, DType::float32, {rows, dim}, gpu)),
                          Catch::Contains("ids[77] = " + std::to_string(bad)));
    }
    // The other op next, on the same context: exact against the CPU.
    q.upload();
    set_all(-1, 0);
    embrope::apply_rope(Tensor(q.device, DType::float32, {rows, heads, dim}, gpu), std::nullopt,
                        Tensor(pos.device, DType::int64, {rows}, gpu), cache);
    std::vector<unsigned char> expect(q.host);
    embrope::apply_rope(Tensor(expect.data(), DType::float32, {rows, heads, dim}), std::nullopt,
                        Tensor(pos.host.data(), DType::int64, {rows}), cpu_cache);
    compare_rows(q.download(), expect, DType::float32, rows * heads * dim, dim);

    // And the other way round: a bad position, then embed.
    set_all(77, bad);
    q.upload();
    REQUIRE_THROWS_WITH(
        embrope::apply_rope(Tensor(q.device, DType::float32, {rows, heads, dim}, gpu), std::nullopt,
                            Tensor(pos.device, DType::int64, {rows}, gpu), cache),
        Catch::Contains("positions[77] = " + std::to_string(bad)));
    set_all(-1, 0);
    embrope::embed(Tensor(table.device, DType::float32, {vocab, dim}, gpu),
                   Tensor(ids.device, DType::int64, {rows}, gpu),
                   Tensor(out.device, DType::float32, {rows, dim}, gpu));
    std::vector<unsigned char> expect_out(out.host.size());
    embrope::embed(Tensor(table.host.data(), DType::float32, {vocab, dim}),
                   Tensor(ids.host.data(), DType::int64, {rows}),
                   Tensor(expect_out.data(), DType::float32, {rows, dim}));
    compare_rows(out.download(), expect_out, DType::float32, rows * dim, dim);
  }
}
