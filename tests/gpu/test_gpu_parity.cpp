// Every op on the GPU against the CPU path (the oracle, itself tested against float64
// references): float32 within 1e-6 relative to the row norm, float16/bfloat16 within one
// output ulp. Outputs are poisoned before each call.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
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

// Element checks run outside Catch2's macros (an INFO or REQUIRE per element costs about a
// microsecond, hours over the sweep): mismatches are counted, the first few described, and
// one assertion made per comparison.
struct Mismatches {
  std::int64_t count = 0;
  std::string first;
  template <typename Describe>
  void check(bool ok, Describe&& describe) {
    if (ok) return;
    if (count < 5) first += describe() + "\n";
    ++count;
  }
  void require() const {
    INFO(count << " mismatches; the first:\n" << first);
    REQUIRE(count == 0);
  }
};

std::string where(std::int64_t row, std::int64_t element, double gpu, double cpu) {
  std::ostringstream o;
  o.precision(9);
  o << "row " << row << " element " << element << ": gpu " << gpu << " cpu " << cpu;
  return o.str();
}

// Compares rows of `dim` elements: GPU output against CPU output.
void compare_rows(const std::vector<unsigned char>& gpu, const std::vector<unsigned char>& cpu,
                  DType dtype, std::int64_t count, std::int64_t dim) {
  Mismatches mm;
  for (std::int64_t row = 0; row * dim < count; ++row) {
    // Elements left untouched by both (poison, padding) may be NaN or huge: they must match
    // bit for bit and stay out of the norm.
    double norm = 0;
    for (std::int64_t j = 0; j < dim; ++j) {
      const double v = load_value(cpu.data(), dtype, row * dim + j);
      if (std::isfinite(v) && std::fabs(v) < 1e4) norm += v * v;
    }
    norm = std::sqrt(norm);
    const int es = embrope::dtype_size(dtype);
    for (std::int64_t j = 0; j < dim; ++j) {
      const float g = load_value(gpu.data(), dtype, row * dim + j);
      const float c = load_value(cpu.data(), dtype, row * dim + j);
      bool ok;
      if (!std::isfinite(c) || std::fabs(c) >= 1e4) {
        ok = std::memcmp(gpu.data() + (row * dim + j) * es, cpu.data() + (row * dim + j) * es,
                         static_cast<std::size_t>(es)) == 0;
      } else if (!std::isfinite(g)) {
        ok = false;
      } else if (dtype == DType::float32) {
        ok = std::fabs(g - c) <= 1e-6 * (norm + 1e-30) + 1e-30;
      } else {
        // one ulp of the output dtype at the larger magnitude
        const int mantissa = dtype == DType::float16 ? 10 : 7;
        const float m = std::fmax(std::fabs(g), std::fabs(c));
        const float ulp = m == 0 ? 0 : std::ldexp(1.0f, std::ilogb(m) - mantissa);
        ok = std::fabs(g - c) <= ulp + 1e-7f;
      }
      mm.check(ok, [&] { return where(row, j, g, c); });
    }
  }
  mm.require();
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

namespace {

// cos and sin tables, GPU against CPU: within one float32 ulp of the CPU's magnitude (the
// device's float64 cos and sin may differ from the host's in the last float64 bits, which can
// move the float32 rounding by one ulp).
void compare_tables(const std::vector<float>& cpu_cos, const std::vector<float>& cpu_sin,
                    const std::vector<float>& gpu_cos, const std::vector<float>& gpu_sin) {
  Mismatches mm;
  auto one_ulp = [](float c, float g) {
    const float m = std::fabs(c);
    return std::fabs(c - g) <= std::nextafter(m, INFINITY) - m;
  };
  for (std::size_t i = 0; i < cpu_cos.size(); ++i) {
    const auto e = static_cast<std::int64_t>(i);
    mm.check(one_ulp(cpu_cos[i], gpu_cos[i]), [&] { return where(e, 0, gpu_cos[i], cpu_cos[i]); });
    mm.check(one_ulp(cpu_sin[i], gpu_sin[i]), [&] { return where(e, 1, gpu_sin[i], cpu_sin[i]); });
  }
  mm.require();
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
    compare_tables(cc, cs, gc, gs);
    for (std::size_t i = 0; i < n; ++i) differ += (cc[i] != gc[i]) + (cs[i] != gs[i]);
    WARN("rotary_dim " << r << ": " << differ << " of " << 2 * n << " values differ by one ulp");
  }
}

// EMBROPE_GPU_SWEEP=reduced (set under compute-sanitizer, which slows every launch down)
// keeps the sweep's decode token counts (1 and 64) and drops 3 and 4097.
bool reduced_sweep() {
  const char* v = std::getenv("EMBROPE_GPU_SWEEP");
  return v != nullptr && std::string(v) == "reduced";
}

TEST_CASE("GPU RoPE equals CPU RoPE over the grid", "[gpu][rope][sweep]") {
  const bool reduced = reduced_sweep();
  if (reduced) WARN("EMBROPE_GPU_SWEEP=reduced: token counts 1 and 64 only");
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
      for (std::int64_t d : {64, 80, 96, 128, 256}) {
        for (bool partial : {false, true}) {
          for (auto heads : {std::pair<std::int64_t, std::int64_t>{32, 8}, {7, 1}, {1, 1}}) {
            for (std::int64_t tokens : {1, 3, 64, 4097}) {
              for (bool strided : {false, true}) {
                for (bool in_place : {true, false}) {
                  if (reduced && (tokens == 3 || tokens == 4097)) continue;
                  // 4097 tokens (the prefill launch shape) with every head size for 7/1 and
                  // 1/1 heads, but with 32/8 heads at D = 128 only: the CPU reference and the
                  // comparison of 32/8 heads at every size would take minutes.
                  if (tokens == 4097 && heads.first == 32 && d != 128) continue;
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
  // Two calls, the same row bad in both: the first call's report is kept (as on the CPU), not
  // re-described with the second call's value; a later, lower row replaces it.
  embrope::apply_rope(gq, std::nullopt, gp, cache, options);  // positions[37] = 4133
  const std::int64_t other = 5000;
  std::memcpy(pos.host.data() + 8 * 37, &other, 8);
  pos.upload();
  embrope::apply_rope(gq, std::nullopt, gp, cache, options);  // positions[37] = 5000
  REQUIRE_THROWS_WITH(status.check(), Catch::Contains("positions[37] = 4133"));
  embrope::apply_rope(gq, std::nullopt, gp, cache, options);  // positions[37] = 5000
  const std::int64_t lower = -1;
  std::memcpy(pos.host.data() + 8 * 12, &lower, 8);
  pos.upload();
  embrope::apply_rope(gq, std::nullopt, gp, cache, options);  // positions[12] = -1 first
  REQUIRE_THROWS_WITH(status.check(), Catch::Contains("positions[12] = -1"));
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
      // 8..128: sub-warp groups of 4, 8, 16 lanes on the 16-byte path; 100: the scalar path
      // for 16-bit values; 102: the scalar path for every dtype.
      for (std::int64_t dim : {8, 16, 32, 64, 100, 102, 128, 4096}) {
        // explicit: ids strided (every other element), int32 type ids, explicit position ids
        // (instead of per-row offsets), and a DeferredStatus instead of the checked call.
        for (bool explicit_args : {false, true}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " positions "
                        << static_cast<int>(positions) << " D " << dim << " explicit "
                        << explicit_args);
          const std::int64_t vocab = 1000, batch = 3, seq = 37, max_pos = 512, types = 2;
          const int es = embrope::dtype_size(dtype);
          const std::int64_t id_step = explicit_args ? 2 : 1;
          const DType type_dtype = explicit_args ? DType::int32 : DType::int64;
          const int ts = embrope::dtype_size(type_dtype);
          Buffer table(vocab * dim * es), ptable(max_pos * dim * es), ttable(types * dim * es);
          Buffer ids(batch * seq * id_step * 4), tids(batch * seq * ts), offsets(batch * 8);
          Buffer pids(batch * seq * 8), out(batch * seq * dim * es);
          fill_random(table, dtype, vocab * dim, 1);
          fill_random(ptable, dtype, max_pos * dim, 2);
          fill_random(ttable, dtype, types * dim, 3);
          std::mt19937_64 rng(4);
          for (std::int64_t n = 0; n < batch * seq; ++n) {
            const std::int32_t id = static_cast<std::int32_t>(rng() % vocab);
            const std::int64_t tid = static_cast<std::int64_t>(rng() % types);
            const std::int32_t tid32 = static_cast<std::int32_t>(tid);
            const std::int64_t pid = static_cast<std::int64_t>(rng() % max_pos);
            std::memcpy(ids.host.data() + 4 * n * id_step, &id, 4);
            if (explicit_args) {
              std::memcpy(ids.host.data() + 4 * (n * id_step + 1), &id, 4);  // not read
              std::memcpy(tids.host.data() + 4 * n, &tid32, 4);
            } else {
              std::memcpy(tids.host.data() + 8 * n, &tid, 8);
            }
            std::memcpy(pids.host.data() + 8 * n, &pid, 8);
          }
          for (std::int64_t b = 0; b < batch; ++b) {
            const std::int64_t o = 100 * b;
            std::memcpy(offsets.host.data() + 8 * b, &o, 8);
          }
          for (Buffer* b : {&table, &ptable, &ttable, &ids, &tids, &offsets, &pids}) b->upload();
          out.poison_both(0xff);
          auto run = [&](bool gpu) {
            const Device d = gpu ? Device::cuda(0) : Device::cpu();
            auto ptr = [&](Buffer& b) -> void* { return gpu ? b.device : b.host.data(); };
            embrope::DeferredStatus status(d);
            embrope::EmbedOptions o;
            o.scale = 1.5f;
            o.positions = positions;
            if (positions == embrope::PositionEncoding::learned) {
              o.position_table = Tensor(ptr(ptable), dtype, {max_pos, dim}, d);
            }
            if (positions != embrope::PositionEncoding::none) {
              if (explicit_args) {
                o.position_ids = Tensor(ptr(pids), DType::int64, {batch, seq}, d);
              } else {
                o.position_offsets = Tensor(ptr(offsets), DType::int64, {batch}, d);
              }
            }
            o.type_table = Tensor(ptr(ttable), dtype, {types, dim}, d);
            o.type_ids = Tensor(ptr(tids), type_dtype, {batch, seq}, d);
            if (explicit_args) o.deferred = &status;
            embrope::embed(
                Tensor(ptr(table), dtype, {vocab, dim}, d),
                Tensor(ptr(ids), DType::int32, {batch, seq}, {seq * id_step, id_step}, d),
                Tensor(ptr(out), dtype, {batch, seq, dim}, d), o);
            CHECK(status.ok());
          };
          run(false);
          run(true);
          cuda_check(cudaDeviceSynchronize());
          compare_rows(out.download(), out.host, dtype, batch * seq * dim, dim);
        }
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

// ------------------------------------------------- scaling variants and mrope ----

namespace {

std::vector<std::pair<const char*, embrope::RopeConfig>> scaled_configs() {
  std::vector<std::pair<const char*, embrope::RopeConfig>> out;
  embrope::RopeConfig c{128, 500000.0, 140000};
  c.scaling = embrope::RopeScaling::llama3;
  c.factor = 8.0;
  c.original_max_positions = 8192;
  out.emplace_back("llama3", c);
  c = embrope::RopeConfig{64, 10000.0, 140000};
  c.scaling = embrope::RopeScaling::yarn;
  c.factor = 40.0;
  c.original_max_positions = 4096;
  c.mscale = c.mscale_all_dim = 0.707;
  out.emplace_back("yarn", c);
  c = embrope::RopeConfig{128, 10000.0, 140000};
  c.scaling = embrope::RopeScaling::linear;
  c.factor = 4.0;
  out.emplace_back("linear", c);
  c.scaling = embrope::RopeScaling::dynamic;
  c.factor = 2.0;
  c.original_max_positions = 4096;
  out.emplace_back("dynamic", c);
  c = embrope::RopeConfig{96, 10000.0, 140000};
  c.scaling = embrope::RopeScaling::longrope;
  c.factor = 32.0;
  c.original_max_positions = 4096;
  for (int i = 0; i < 48; ++i) {
    c.short_factor.push_back(1.0 + 0.05 * i);
    c.long_factor.push_back(1.0 + 1.3 * i);
  }
  out.emplace_back("longrope", c);
  return out;
}

}  // namespace

TEST_CASE("GPU caches of every scaling variant equal the CPU caches within one float32 ulp",
          "[gpu][rope_cache][scaling]") {
  for (const auto& [name, config] : scaled_configs()) {
    INFO(name);
    embrope::RopeCache cpu(config);
    embrope::RopeCache gpu(config, Device::cuda(0));
    REQUIRE(gpu.attention_factor() == cpu.attention_factor());
    const std::size_t n = static_cast<std::size_t>(config.max_positions * config.rotary_dim / 2);
    std::vector<float> cc(n), cs(n), gc(n), gs(n);
    cpu.copy_to_host(cc.data(), cs.data());
    gpu.copy_to_host(gc.data(), gs.data());
    compare_tables(cc, cs, gc, gs);
  }
}

TEST_CASE("GPU mrope equals CPU mrope, including chunks that straddle a section",
          "[gpu][rope][mrope]") {
  struct Sections {
    std::int64_t head_dim, rotary_dim;
    std::array<std::int64_t, 3> section;
  };
  const Sections all[] = {{128, 128, {16, 24, 24}}, {128, 64, {10, 11, 11}}, {80, 80, {0, 20, 20}}};
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
      for (const Sections& sec : all) {
        for (std::int64_t tokens : {1, 5, 300}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " layout " << static_cast<int>(layout)
                        << " D " << sec.head_dim << " R " << sec.rotary_dim << " T " << tokens);
          const int es = embrope::dtype_size(dtype);
          const std::int64_t hq = 7, hk = 2, d = sec.head_dim;
          Buffer q(tokens * hq * d * es), k(tokens * hk * d * es), pos(3 * tokens * 8);
          fill_random(q, dtype, tokens * hq * d, 31 + tokens);
          fill_random(k, dtype, tokens * hk * d, 37 + tokens);
          std::mt19937_64 rng(tokens);
          for (std::int64_t i = 0; i < 3 * tokens; ++i) {
            const std::int64_t p = static_cast<std::int64_t>(rng() % 3000);
            std::memcpy(pos.host.data() + 8 * i, &p, 8);
          }
          q.upload();
          k.upload();
          pos.upload();
          const embrope::RopeConfig config{sec.rotary_dim, 1000000.0, 3000};
          embrope::RopeCache cpu_cache(config);
          embrope::RopeCache gpu_cache(config, Device::cuda(0));
          embrope::RopeOptions opt;
          opt.layout = layout;
          opt.mrope_section = sec.section;
          embrope::apply_rope(Tensor(q.host.data(), dtype, {tokens, hq, d}),
                              Tensor(k.host.data(), dtype, {tokens, hk, d}),
                              Tensor(pos.host.data(), DType::int64, {3, tokens}), cpu_cache, opt);
          const Device g = Device::cuda(0);
          embrope::apply_rope(Tensor(q.device, dtype, {tokens, hq, d}, g),
                              Tensor(k.device, dtype, {tokens, hk, d}, g),
                              Tensor(pos.device, DType::int64, {3, tokens}, g), gpu_cache, opt);
          cuda_check(cudaDeviceSynchronize());
          compare_rows(q.download(), q.host, dtype, tokens * hq * d, d);
          compare_rows(k.download(), k.host, dtype, tokens * hk * d, d);
        }
      }
    }
  }
}

TEST_CASE("GPU RoPE with scaled caches equals the CPU at long positions", "[gpu][rope][scaling]") {
  for (const auto& [name, config] : scaled_configs()) {
    INFO(name);
    const std::int64_t tokens = 64, hq = 8, hk = 2, d = config.rotary_dim;
    Buffer q(tokens * hq * d * 2), k(tokens * hk * d * 2), pos(tokens * 8);
    fill_random(q, DType::bfloat16, tokens * hq * d, 5);
    fill_random(k, DType::bfloat16, tokens * hk * d, 6);
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t p = t < 32 ? t * 4093 : 131071 - t;
      std::memcpy(pos.host.data() + 8 * t, &p, 8);
    }
    q.upload();
    k.upload();
    pos.upload();
    embrope::RopeCache cpu_cache(config);
    embrope::RopeCache gpu_cache(config, Device::cuda(0));
    const Device g = Device::cuda(0);
    embrope::apply_rope(Tensor(q.host.data(), DType::bfloat16, {tokens, hq, d}),
                        Tensor(k.host.data(), DType::bfloat16, {tokens, hk, d}),
                        Tensor(pos.host.data(), DType::int64, {tokens}), cpu_cache);
    embrope::apply_rope(Tensor(q.device, DType::bfloat16, {tokens, hq, d}, g),
                        Tensor(k.device, DType::bfloat16, {tokens, hk, d}, g),
                        Tensor(pos.device, DType::int64, {tokens}, g), gpu_cache);
    cuda_check(cudaDeviceSynchronize());
    compare_rows(q.download(), q.host, DType::bfloat16, tokens * hq * d, d);
    compare_rows(k.download(), k.host, DType::bfloat16, tokens * hk * d, d);
  }
}

TEST_CASE("GPU packed_positions equals the CPU, bad cu_seqlens reported, context usable",
          "[gpu][packed_positions]") {
  for (std::int64_t sequences : {1, 7, 3000}) {
    for (DType pos_dtype : {DType::int32, DType::int64}) {
      INFO("B " << sequences << " positions " << embrope::dtype_name(pos_dtype));
      std::mt19937_64 rng(sequences);
      std::vector<std::int64_t> cu = {0}, starts;
      for (std::int64_t b = 0; b < sequences; ++b) {
        const std::int64_t len = rng() % 5 == 0 ? 0 : static_cast<std::int64_t>(rng() % 700);
        cu.push_back(cu.back() + len);
        starts.push_back(static_cast<std::int64_t>(rng() % 100000));
      }
      const std::int64_t tokens = cu.back();
      const int es = embrope::dtype_size(pos_dtype);
      Buffer cu_b(cu.size() * 8), start_b(starts.size() * 8), pos(tokens * es + 1);
      std::memcpy(cu_b.host.data(), cu.data(), cu.size() * 8);
      std::memcpy(start_b.host.data(), starts.data(), starts.size() * 8);
      cu_b.upload();
      start_b.upload();
      pos.poison_both(0xee);
      const Device g = Device::cuda(0);
      embrope::PackedPositionsOptions cpu_opt, gpu_opt;
      cpu_opt.start_offsets = Tensor(start_b.host.data(), DType::int64, {sequences});
      gpu_opt.start_offsets = Tensor(start_b.device, DType::int64, {sequences}, g);
      embrope::packed_positions(Tensor(cu_b.host.data(), DType::int64, {sequences + 1}),
                                Tensor(pos.host.data(), pos_dtype, {tokens}), cpu_opt);
      embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
      REQUIRE(pos.download() == pos.host);

      // A decreasing entry: reported by index and value; then the next call works.
      if (sequences >= 7) {
        std::vector<std::int64_t> bad = cu;
        bad[4] = bad[3] - 1;
        std::memcpy(cu_b.host.data(), bad.data(), bad.size() * 8);
        cu_b.upload();
        try {
          embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                    Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
          FAIL("no error for a decreasing cu_seqlens");
        } catch (const embrope::Error& e) {
          CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
          CHECK(std::string(e.what()).find("cu_seqlens[4]") != std::string::npos);
        }
        std::memcpy(cu_b.host.data(), cu.data(), cu.size() * 8);
        cu_b.upload();
        embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                  Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
        REQUIRE(pos.download() == pos.host);
      }
    }
  }
}

// Bad cu_seqlens and start offsets: the GPU reports what the CPU reports (the first bad
// entry, a bad cu_seqlens before any start offset), writes the same -1 positions, and never
// touches memory outside its buffers (compute-sanitizer watches the negative entries).
TEST_CASE("GPU packed_positions reports bad entries as the CPU does", "[gpu][packed_positions]") {
  const std::int64_t big = std::int64_t{1} << 40;
  struct Case {
    const char* name;
    std::vector<std::int64_t> cu, starts;  // starts empty: no start_offsets
    const char* expected;                  // in the message, or null for no error
  };
  const std::vector<Case> cases = {
      {"negative entries after a bad one", {0, 4, -big, -big / 2, -3, 10}, {}, "cu_seqlens[2]"},
      {"a small negative entry after a bad one", {0, 4, -2, -1, 10}, {}, "cu_seqlens[2]"},
      {"a bad start of an empty sequence", {0, 4, 4, 10}, {0, -5, 7}, "start_offsets[1]"},
      {"bad starts and no tokens", {0, 0, 0}, {3, -1}, "start_offsets[1]"},
      {"a bad start before a bad cu_seqlens", {0, 4, 3, 10}, {-1, 0, 0}, "cu_seqlens[2]"},
      {"good starts and no tokens", {0, 0, 0, 0}, {1, 2, 3}, nullptr},
  };
  for (const Case& c : cases) {
    for (DType pos_dtype : {DType::int32, DType::int64}) {
      INFO(c.name << ", positions " << embrope::dtype_name(pos_dtype));
      const auto sequences = static_cast<std::int64_t>(c.cu.size()) - 1;
      const std::int64_t tokens = c.cu.back() < 0 ? 0 : c.cu.back();
      const int es = embrope::dtype_size(pos_dtype);
      Buffer cu_b(c.cu.size() * 8), start_b(c.starts.size() * 8), pos(tokens * es);
      std::memcpy(cu_b.host.data(), c.cu.data(), c.cu.size() * 8);
      if (!c.starts.empty()) std::memcpy(start_b.host.data(), c.starts.data(), c.starts.size() * 8);
      cu_b.upload();
      start_b.upload();
      pos.poison_both(0xee);
      const Device g = Device::cuda(0);
      embrope::PackedPositionsOptions cpu_opt, gpu_opt;
      if (!c.starts.empty()) {
        cpu_opt.start_offsets = Tensor(start_b.host.data(), DType::int64, {sequences});
        gpu_opt.start_offsets = Tensor(start_b.device, DType::int64, {sequences}, g);
      }
      auto message = [](auto&& call) -> std::string {
        try {
          call();
        } catch (const embrope::Error& e) {
          CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
          return e.what();
        }
        return "";
      };
      const std::string cpu_error = message([&] {
        embrope::packed_positions(Tensor(cu_b.host.data(), DType::int64, {sequences + 1}),
                                  Tensor(pos.host.data(), pos_dtype, {tokens}), cpu_opt);
      });
      const std::string gpu_error = message([&] {
        embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                  Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
      });
      CHECK(gpu_error == cpu_error);
      if (c.expected == nullptr) {
        CHECK(cpu_error.empty());
      } else {
        CHECK(cpu_error.find(c.expected) != std::string::npos);
      }
      REQUIRE(pos.download() == pos.host);
      // The context stays usable: a valid call afterwards.
      const std::vector<std::int64_t> good = {0, 2, 5};
      Buffer good_b(good.size() * 8), good_pos(5 * 8);
      std::memcpy(good_b.host.data(), good.data(), good.size() * 8);
      good_b.upload();
      embrope::packed_positions(Tensor(good_b.device, DType::int64, {3}, g),
                                Tensor(good_pos.device, DType::int64, {5}, g));
      const std::vector<unsigned char> got = good_pos.download();
      std::int64_t values[5];
      std::memcpy(values, got.data(), sizeof values);
      CHECK(
          (values[0] == 0 && values[1] == 1 && values[2] == 0 && values[3] == 1 && values[4] == 2));
    }
  }
}

// ---------------------------------- the CPU suite's other scenarios, on the GPU ----

TEST_CASE("GPU RoPE: [B, S, H, D] views of a [B, H, S, D] buffer, int32 positions, inverse",
          "[gpu][rope]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (bool inverse : {false, true}) {
      for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
        // pad 8 with offset 0: the 16-byte vector path with B > 1; pad 2, or q starting one
        // element into its buffer: the scalar path.
        for (std::int64_t pad : {2, 8}) {
          for (std::int64_t offset : {0, 1}) {
            INFO("dtype " << embrope::dtype_name(dtype) << " inverse " << inverse << " layout "
                          << static_cast<int>(layout) << " pad " << pad << " offset " << offset);
            const std::int64_t b = 3, s = 17, hq = 6, hk = 2, d = 128, r = 96;
            const int es = embrope::dtype_size(dtype);
            // q stored [B, Hq, S, D + pad] and viewed as [B, S, Hq, D] through its strides.
            const std::int64_t row = d + pad;
            const std::int64_t q_elements = offset + b * hq * s * row;
            Buffer q(q_elements * es), k(b * s * hk * d * es), pos(b * s * 4);
            fill_random(q, dtype, q_elements, 11);
            fill_random(k, dtype, b * s * hk * d, 12);
            std::mt19937_64 rng(13);
            for (std::int64_t i = 0; i < b * s; ++i) {
              const auto p = static_cast<std::int32_t>(rng() % 2048);
              std::memcpy(pos.host.data() + 4 * i, &p, 4);
            }
            q.upload();
            k.upload();
            pos.upload();
            const embrope::RopeConfig config{r, 10000.0, 2048};
            embrope::RopeCache cpu_cache(config);
            embrope::RopeCache gpu_cache(config, Device::cuda(0));
            embrope::RopeOptions opt;
            opt.layout = layout;
            opt.inverse = inverse;
            auto run = [&](bool gpu) {
              const Device dev = gpu ? Device::cuda(0) : Device::cpu();
              auto* qp = static_cast<unsigned char*>(gpu ? q.device : q.host.data()) + offset * es;
              void* kp = gpu ? k.device : k.host.data();
              void* pp = gpu ? pos.device : pos.host.data();
              embrope::apply_rope(
                  Tensor(qp, dtype, {b, s, hq, d}, {hq * s * row, row, s * row, 1}, dev),
                  Tensor(kp, dtype, {b, s, hk, d}, dev), Tensor(pp, DType::int32, {b, s}, dev),
                  gpu ? gpu_cache : cpu_cache, opt);
            };
            run(false);
            run(true);
            cuda_check(cudaDeviceSynchronize());
            std::vector<unsigned char> gq = q.download(), cq = q.host;
            // The element before q's view is compared too: it must be untouched.
            REQUIRE(std::memcmp(gq.data(), cq.data(), static_cast<std::size_t>(offset * es)) == 0);
            gq.erase(gq.begin(), gq.begin() + offset * es);
            cq.erase(cq.begin(), cq.begin() + offset * es);
            compare_rows(gq, cq, dtype, b * hq * s * row, row);
            compare_rows(k.download(), k.host, dtype, b * s * hk * d, d);
          }
        }
      }
    }
  }
}

TEST_CASE("GPU RoPE with caller cos/sin tables of every value dtype", "[gpu][rope]") {
  for (DType table_dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType dtype : {DType::float32, DType::float16}) {
      INFO("table " << embrope::dtype_name(table_dtype) << " q " << embrope::dtype_name(dtype));
      const std::int64_t t = 33, h = 5, d = 64, max_pos = 300;
      const int es = embrope::dtype_size(dtype), ts = embrope::dtype_size(table_dtype);
      Buffer q(t * h * d * es), cos(max_pos * d / 2 * ts), sin(max_pos * d / 2 * ts), pos(t * 8);
      fill_random(q, dtype, t * h * d, 21);
      fill_random(cos, table_dtype, max_pos * d / 2, 22);
      fill_random(sin, table_dtype, max_pos * d / 2, 23);
      for (std::int64_t i = 0; i < t; ++i) {
        const std::int64_t p = (i * 37) % max_pos;
        std::memcpy(pos.host.data() + 8 * i, &p, 8);
      }
      for (Buffer* x : {&q, &cos, &sin, &pos}) x->upload();
      auto run = [&](bool gpu) {
        const Device dev = gpu ? Device::cuda(0) : Device::cpu();
        auto ptr = [&](Buffer& x) -> void* { return gpu ? x.device : x.host.data(); };
        embrope::apply_rope(Tensor(ptr(q), dtype, {t, h, d}, dev), std::nullopt,
                            Tensor(ptr(pos), DType::int64, {t}, dev),
                            Tensor(ptr(cos), table_dtype, {max_pos, d / 2}, dev),
                            Tensor(ptr(sin), table_dtype, {max_pos, d / 2}, dev));
      };
      run(false);
      run(true);
      cuda_check(cudaDeviceSynchronize());
      compare_rows(q.download(), q.host, dtype, t * h * d, d);
    }
  }
}

TEST_CASE("GPU embed: vocab shards, explicit positions, split sinusoids, strided out",
          "[gpu][embed]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (bool split : {false, true}) {
      INFO("dtype " << embrope::dtype_name(dtype) << " split " << split);
      const std::int64_t vocab = 500, vocab_start = 1000, n = 77, dim = 96, pad = 8;
      const int es = embrope::dtype_size(dtype);
      Buffer table(vocab * dim * es), ids(n * 8), pids(n * 8), out(n * (dim + pad) * es);
      fill_random(table, dtype, vocab * dim, 31);
      std::mt19937_64 rng(32);
      for (std::int64_t i = 0; i < n; ++i) {
        // About a third of the ids fall outside the shard [1000, 1500): zero token rows.
        const std::int64_t id = 800 + static_cast<std::int64_t>(rng() % 900);
        const std::int64_t p = static_cast<std::int64_t>(rng() % 100000);
        std::memcpy(ids.host.data() + 8 * i, &id, 8);
        std::memcpy(pids.host.data() + 8 * i, &p, 8);
      }
      for (Buffer* x : {&table, &ids, &pids}) x->upload();
      out.poison_both(0x3c);  // small finite values in every dtype
      auto run = [&](bool gpu) {
        const Device dev = gpu ? Device::cuda(0) : Device::cpu();
        auto ptr = [&](Buffer& x) -> void* { return gpu ? x.device : x.host.data(); };
        embrope::EmbedOptions o;
        o.vocab_start = vocab_start;
        o.vocab_shard = true;
        o.scale = 0.5f;
        o.positions = embrope::PositionEncoding::sinusoidal;
        o.sinusoid_layout =
            split ? embrope::SinusoidLayout::split : embrope::SinusoidLayout::interleaved;
        o.position_ids = Tensor(ptr(pids), DType::int64, {n}, dev);
        embrope::embed(Tensor(ptr(table), dtype, {vocab, dim}, dev),
                       Tensor(ptr(ids), DType::int64, {n}, dev),
                       Tensor(ptr(out), dtype, {n, dim}, {dim + pad, 1}, dev), o);
      };
      run(false);
      run(true);
      cuda_check(cudaDeviceSynchronize());
      // Rows of dim + pad: the padding must still hold the poison on both sides.
      compare_rows(out.download(), out.host, dtype, n * (dim + pad), dim + pad);
    }
  }
}

TEST_CASE("GPU ops with no tokens are no-ops", "[gpu]") {
  Buffer q(4), pos(8), table(64 * 4), out(4);
  embrope::RopeCache cache({8, 10000.0, 16}, Device::cuda(0));
  const Device g = Device::cuda(0);
  CHECK_NOTHROW(embrope::apply_rope(Tensor(q.device, DType::float32, {0, 2, 8}, g), std::nullopt,
                                    Tensor(pos.device, DType::int64, {0}, g), cache));
  CHECK_NOTHROW(embrope::embed(Tensor(table.device, DType::float32, {8, 8}, g),
                               Tensor(pos.device, DType::int64, {0}, g),
                               Tensor(out.device, DType::float32, {0, 8}, g)));
}

TEST_CASE("GPU RoPE with no heads in q, in k, or in both", "[gpu][rope]") {
  const std::int64_t tokens = 3, heads = 2, dim = 8;
  const Device g = Device::cuda(0);
  embrope::RopeCache cpu_cache({dim, 10000.0, 16});
  embrope::RopeCache gpu_cache({dim, 10000.0, 16}, g);
  Buffer none(4), x(tokens * heads * dim * 4), pos(tokens * 8);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t p = 5 * t;
    std::memcpy(pos.host.data() + 8 * t, &p, 8);
  }
  pos.upload();
  const Tensor empty_gpu(none.device, DType::float32, {tokens, 0, dim}, g);
  const Tensor empty_cpu(none.host.data(), DType::float32, {tokens, 0, dim});
  CHECK_NOTHROW(embrope::apply_rope(empty_gpu, empty_gpu,
                                    Tensor(pos.device, DType::int64, {tokens}, g), gpu_cache));
  for (bool empty_q : {true, false}) {
    INFO("no heads in " << (empty_q ? "q" : "k"));
    fill_random(x, DType::float32, tokens * heads * dim, 3);
    x.upload();
    const Tensor xg(x.device, DType::float32, {tokens, heads, dim}, g);
    const Tensor xc(x.host.data(), DType::float32, {tokens, heads, dim});
    const Tensor pg(pos.device, DType::int64, {tokens}, g);
    const Tensor pc(pos.host.data(), DType::int64, {tokens});
    if (empty_q) {
      embrope::apply_rope(empty_gpu, xg, pg, gpu_cache);
      embrope::apply_rope(empty_cpu, xc, pc, cpu_cache);
    } else {
      embrope::apply_rope(xg, empty_gpu, pg, gpu_cache);
      embrope::apply_rope(xc, empty_cpu, pc, cpu_cache);
    }
    cuda_check(cudaDeviceSynchronize());
    compare_rows(x.download(), x.host, DType::float32, tokens * heads * dim, dim);
  }
}

// ------------------------------------------------------------ backward passes -----------

namespace {

struct BackwardSetup {
  DType dtype = DType::float32, grad_dtype = DType::float32;
  std::int64_t vocab = 1000, dim = 64, rows = 0, max_pos = 512, types = 3;
  std::vector<std::int64_t> ids;  // the id of each row
};

// Runs embed_backward on the CPU and on the GPU (twice, the second time with a caller
// workspace on another stream) from the same initial gradients. Returns the GPU results of
// both runs and the CPU result for the token, position and type gradients, concatenated.
struct BackwardResults {
  std::vector<unsigned char> gpu_first, gpu_second, cpu;
  std::vector<double> magnitude;    // per element: |initial| + sum of |terms| (for tolerances)
  std::vector<std::int64_t> count;  // per element: the number of terms
};

BackwardResults run_backward_case(const BackwardSetup& s, embrope::BackwardMode mode) {
  const int es = embrope::dtype_size(s.dtype);
  const int gs = embrope::dtype_size(s.grad_dtype);
  const std::int64_t n = s.rows, d = s.dim;
  const std::int64_t grad_rows = s.vocab + s.max_pos + s.types;
  Buffer grad_out(n * d * es), ids(n * 8), pids(n * 4), tids(n * 8), grads(grad_rows * d * gs);
  fill_random(grad_out, s.dtype, n * d, 71);
  fill_random(grads, s.grad_dtype, grad_rows * d, 72);
  std::mt19937_64 rng(73);
  std::vector<std::int64_t> pos(n), typ(n);
  for (std::int64_t r = 0; r < n; ++r) {
    std::memcpy(ids.host.data() + 8 * r, &s.ids[r], 8);
    const std::int32_t p = static_cast<std::int32_t>(rng() % s.max_pos);
    const std::int64_t t = static_cast<std::int64_t>(rng() % s.types);
    pos[r] = p;
    typ[r] = t;
    std::memcpy(pids.host.data() + 4 * r, &p, 4);
    std::memcpy(tids.host.data() + 8 * r, &t, 8);
  }
  for (Buffer* b : {&grad_out, &ids, &pids, &tids, &grads}) b->upload();
  const std::vector<unsigned char> initial = grads.host;
  const float scale = 1.5f;
  const std::int64_t padding = 3;

  BackwardResults out;
  out.magnitude.assign(static_cast<std::size_t>(grad_rows * d), 0.0);
  out.count.assign(out.magnitude.size(), 0);
  for (std::int64_t i = 0; i < grad_rows * d; ++i) {
    out.magnitude[i] = std::fabs(load_value(initial.data(), s.grad_dtype, i));
  }
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t j = 0; j < d; ++j) {
      const double g = std::fabs(load_value(grad_out.host.data(), s.dtype, r * d + j));
      if (s.ids[r] != padding) {
        out.magnitude[s.ids[r] * d + j] += scale * g;
        out.count[s.ids[r] * d + j] += 1;
      }
      out.magnitude[(s.vocab + pos[r]) * d + j] += g;
      out.count[(s.vocab + pos[r]) * d + j] += 1;
      out.magnitude[(s.vocab + s.max_pos + typ[r]) * d + j] += g;
      out.count[(s.vocab + s.max_pos + typ[r]) * d + j] += 1;
    }
  }

  auto call = [&](bool gpu, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    auto ptr = [&](Buffer& b) -> unsigned char* {
      return static_cast<unsigned char*>(gpu ? b.device : static_cast<void*>(b.host.data()));
    };
    embrope::EmbedBackwardOptions o;
    o.scale = scale;
    o.padding_idx = padding;
    o.mode = mode;
    o.grad_position_table =
        Tensor(ptr(grads) + s.vocab * d * gs, s.grad_dtype, {s.max_pos, d}, dev);
    o.position_ids = Tensor(ptr(pids), DType::int32, {n}, dev);
    o.grad_type_table =
        Tensor(ptr(grads) + (s.vocab + s.max_pos) * d * gs, s.grad_dtype, {s.types, d}, dev);
    o.type_ids = Tensor(ptr(tids), DType::int64, {n}, dev);
    o.workspace = workspace;
    o.workspace_bytes = workspace_bytes;
    o.stream.handle = stream;
    const Tensor g(ptr(grad_out), s.dtype, {n, d}, dev);
    const Tensor i(ptr(ids), DType::int64, {n}, dev);
    const Tensor t(ptr(grads), s.grad_dtype, {s.vocab, d}, dev);
    if (workspace != nullptr) {
      REQUIRE(embrope::embed_backward_workspace_size(g, i, t, o) <= workspace_bytes);
    }
    embrope::embed_backward(g, i, t, o);
  };
  call(false, nullptr, 0, nullptr);
  out.cpu = grads.host;
  call(true, nullptr, 0, nullptr);
  cuda_check(cudaDeviceSynchronize());
  out.gpu_first = grads.download();

  // Again from the same initial values, with a caller workspace on a non-default stream.
  grads.host = initial;
  grads.upload();
  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream));
  const std::size_t bytes = [&] {
    embrope::EmbedBackwardOptions o;
    o.mode = mode;
    o.grad_position_table = Tensor(static_cast<unsigned char*>(grads.device) + s.vocab * d * gs,
                                   s.grad_dtype, {s.max_pos, d}, Device::cuda(0));
    o.position_ids = Tensor(pids.device, DType::int32, {n}, Device::cuda(0));
    o.grad_type_table =
        Tensor(static_cast<unsigned char*>(grads.device) + (s.vocab + s.max_pos) * d * gs,
               s.grad_dtype, {s.types, d}, Device::cuda(0));
    o.type_ids = Tensor(tids.device, DType::int64, {n}, Device::cuda(0));
    return embrope::embed_backward_workspace_size(
        Tensor(grad_out.device, s.dtype, {n, d}, Device::cuda(0)),
        Tensor(ids.device, DType::int64, {n}, Device::cuda(0)),
        Tensor(grads.device, s.grad_dtype, {s.vocab, d}, Device::cuda(0)), o);
  }();
  void* workspace = nullptr;
  cuda_check(cudaMalloc(&workspace, bytes == 0 ? 1 : bytes));
  call(true, bytes == 0 ? nullptr : workspace, bytes, stream);
  cuda_check(cudaStreamSynchronize(stream));
  out.gpu_second = grads.download();
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  return out;
}

// GPU against CPU: within (terms + 2) float32 unit roundoffs of the magnitudes (the bound of
// any summation order), plus one output ulp for float16/bfloat16 gradients.
void compare_gradients(const BackwardResults& r, DType grad_dtype) {
  std::int64_t bit_differences = 0;
  Mismatches mm;
  for (std::size_t i = 0; i < r.magnitude.size(); ++i) {
    const float g = load_value(r.gpu_first.data(), grad_dtype, static_cast<std::int64_t>(i));
    const float c = load_value(r.cpu.data(), grad_dtype, static_cast<std::int64_t>(i));
    double tol = 2.0 * static_cast<double>(r.count[i] + 2) * std::ldexp(r.magnitude[i], -24);
    if (grad_dtype != DType::float32) {
      const int mantissa = grad_dtype == DType::float16 ? 10 : 7;
      const float m = std::fmax(std::fabs(g), std::fabs(c));
      tol += m == 0 ? 0 : std::ldexp(1.0, std::ilogb(m) - mantissa);
    }
    mm.check(std::fabs(static_cast<double>(g) - c) <= tol, [&] {
      return where(static_cast<std::int64_t>(i), r.count[i], g, c) + " (element, terms)";
    });
    bit_differences += g != c;
  }
  mm.require();
  WARN(bit_differences << " of " << r.magnitude.size() << " gradient elements differ from the CPU");
}

}  // namespace

TEST_CASE("GPU embed_backward deterministic: bitwise reproducible, equal to the CPU",
          "[gpu][embed_backward]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType grad_dtype : {DType::float32, dtype}) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        for (std::int64_t dim : {64, 100}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " grad " << embrope::dtype_name(grad_dtype)
                        << " pattern " << pattern << " D " << dim);
          BackwardSetup s;
          s.dtype = dtype;
          s.grad_dtype = grad_dtype;
          s.dim = dim;
          s.rows = pattern == 2 ? s.vocab : 5000;
          std::mt19937_64 rng(81);
          for (std::int64_t r = 0; r < s.rows; ++r) {
            s.ids.push_back(pattern == 0   ? static_cast<std::int64_t>(rng() % s.vocab)
                            : pattern == 1 ? 7  // one id on every row: one long run
                                           : (r * 7 + 1) % s.vocab);  // all distinct
          }
          const BackwardResults r = run_backward_case(s, embrope::BackwardMode::deterministic);
          REQUIRE(r.gpu_first == r.gpu_second);
          compare_gradients(r, grad_dtype);
        }
      }
    }
  }
}

TEST_CASE("GPU embed_backward atomic: float32 within the summation bound of the CPU",
          "[gpu][embed_backward]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (int pattern = 0; pattern < 2; ++pattern) {
      BackwardSetup s;
      s.dtype = dtype;
      s.rows = 4096;
      std::mt19937_64 rng(91);
      for (std::int64_t r = 0; r < s.rows; ++r) {
        s.ids.push_back(pattern == 0 ? static_cast<std::int64_t>(rng() % s.vocab) : 11);
      }
      const BackwardResults r = run_backward_case(s, embrope::BackwardMode::atomic);
      compare_gradients(r, DType::float32);
    }
  }
}

TEST_CASE("GPU embed_backward: bad ids are reported, too small a workspace is rejected",
          "[gpu][embed_backward][errors]") {
  const std::int64_t vocab = 50, dim = 32, rows = 1000;
  Buffer grad_out(rows * dim * 4), ids(rows * 8), grad(vocab * dim * 4);
  fill_random(grad_out, DType::float32, rows * dim, 101);
  fill_random(grad, DType::float32, vocab * dim, 102);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t id = r == 611 ? -3 : (r == 900 ? vocab : r % vocab);
    std::memcpy(ids.host.data() + 8 * r, &id, 8);
  }
  for (Buffer* b : {&grad_out, &ids, &grad}) b->upload();
  const Device gpu = Device::cuda(0);
  const Tensor g(grad_out.device, DType::float32, {rows, dim}, gpu);
  const Tensor i(ids.device, DType::int64, {rows}, gpu);
  const Tensor t(grad.device, DType::float32, {vocab, dim}, gpu);
  for (auto mode : {embrope::BackwardMode::deterministic, embrope::BackwardMode::atomic}) {
    embrope::EmbedBackwardOptions o;
    o.mode = mode;
    REQUIRE_THROWS_WITH(embrope::embed_backward(g, i, t, o),
                        Catch::Contains("embed_backward") && Catch::Contains("ids[611] = -3"));
    embrope::DeferredStatus status(gpu);
    o.deferred = &status;
    embrope::embed_backward(g, i, t, o);
    REQUIRE_THROWS_WITH(status.check(), Catch::Contains("ids[611]"));
  }
  // The CPU oracle for the good rows: the same call as a shard that owns [0, vocab).
  grad.upload();
  embrope::EmbedBackwardOptions shard;
  shard.vocab_shard = true;
  embrope::embed_backward(g, i, t, shard);
  embrope::embed_backward(Tensor(grad_out.host.data(), DType::float32, {rows, dim}),
                          Tensor(ids.host.data(), DType::int64, {rows}),
                          Tensor(grad.host.data(), DType::float32, {vocab, dim}), shard);
  compare_rows(grad.download(), grad.host, DType::float32, vocab * dim, dim);

  embrope::EmbedBackwardOptions small;
  const std::size_t bytes = embrope::embed_backward_workspace_size(g, i, t, small);
  REQUIRE(bytes > 0);
  small.workspace = grad.device;  // any device pointer: the size is checked first
  small.workspace_bytes = bytes - 1;
  REQUIRE_THROWS_WITH(embrope::embed_backward(g, i, t, small), Catch::Contains("workspace_bytes"));
  embrope::EmbedBackwardOptions atomic;
  atomic.mode = embrope::BackwardMode::atomic;
  REQUIRE(embrope::embed_backward_workspace_size(g, i, t, atomic) == 0);
}

TEST_CASE("GPU apply_rope_backward equals CPU apply_rope_backward", "[gpu][rope_backward]") {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
      const std::int64_t tokens = 77, hq = 8, hk = 2, dim = 128, rotary = 64;
      const int es = embrope::dtype_size(dtype);
      Buffer dq(tokens * hq * dim * es), dk(tokens * hk * dim * es), pos(tokens * 8);
      fill_random(dq, dtype, tokens * hq * dim, 111);
      fill_random(dk, dtype, tokens * hk * dim, 112);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int64_t p = (t * 37) % 4096;
        std::memcpy(pos.host.data() + 8 * t, &p, 8);
      }
      for (Buffer* b : {&dq, &dk, &pos}) b->upload();
      embrope::RopeCache cpu_cache({rotary, 10000.0, 4096});
      embrope::RopeCache gpu_cache({rotary, 10000.0, 4096}, Device::cuda(0));
      embrope::RopeOptions o;
      o.layout = layout;
      embrope::apply_rope_backward(Tensor(dq.host.data(), dtype, {tokens, hq, dim}),
                                   Tensor(dk.host.data(), dtype, {tokens, hk, dim}),
                                   Tensor(pos.host.data(), DType::int64, {tokens}), cpu_cache, o);
      embrope::apply_rope_backward(Tensor(dq.device, dtype, {tokens, hq, dim}, Device::cuda(0)),
                                   Tensor(dk.device, dtype, {tokens, hk, dim}, Device::cuda(0)),
                                   Tensor(pos.device, DType::int64, {tokens}, Device::cuda(0)),
                                   gpu_cache, o);
      cuda_check(cudaDeviceSynchronize());
      compare_rows(dq.download(), dq.host, dtype, tokens * hq * dim, dim);
      compare_rows(dk.download(), dk.host, dtype, tokens * hk * dim, dim);
    }
  }
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
