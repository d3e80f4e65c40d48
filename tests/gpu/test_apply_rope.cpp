// apply_rope on the GPU against the CPU: the sweep over dtypes, layouts, head sizes, head
// counts, token counts, fused views and out of place; bad positions; mrope; axial RoPE; scaled
// caches; [B, S, H, D] views, caller cos/sin tables, no heads.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../apply_rope_cases.hpp"
#include "gpu_support.hpp"

using namespace gpu_test;
using op_cases::Arrangement;
using op_cases::MropeCase;
using op_cases::RopeCase;
using op_cases::TableKind;

namespace {

// Runs one case of the sweep on the CPU and on the GPU and compares the outputs. The sweep's
// cases are [T, H, D] tensors with int64 positions drawn below max_positions and a RopeCache,
// in place or out of place, contiguous or views into one fused [T, Hq + Hk + Hk, D + 8]
// buffer; their data comes from seeds of their own.
void run_rope_case(const RopeCase& c) {
  INFO(describe(c));
  if (c.batch != 0 || c.arrangement == Arrangement::transposed || c.table != TableKind::cache ||
      c.pos_dtype != DType::int64 || c.inverse || c.position_stride != 1 || !c.positions.empty()) {
    FAIL("not a case of the GPU sweep: " << describe(c));
  }
  const bool strided = c.arrangement == Arrangement::fused_qkv;
  const bool in_place = !c.out_of_place;
  const std::int64_t tokens = c.seq;
  const int es = embrope::dtype_size(c.dtype);
  // Strided: q and k are views into one fused [T, Hq + Hk + Hk, D + pad] buffer.
  const std::int64_t pad = strided ? 8 : 0;
  const std::int64_t row = c.head_dim + pad;
  const std::int64_t token_stride = (c.hq + 2 * c.hk) * row;
  const std::int64_t elements = tokens * token_stride;
  Buffer qkv(elements * es), out(elements * es), pos(tokens * 8);
  fill_random(qkv, c.dtype, elements, 1234 + tokens * 7 + c.head_dim);
  std::mt19937_64 rng(99);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t p = static_cast<std::int64_t>(rng() % c.max_positions);
    std::memcpy(pos.host.data() + 8 * t, &p, 8);
  }
  qkv.upload();
  pos.upload();
  out.poison_both(0xff);

  embrope::RopeCache cpu_cache({c.rotary_dim, c.base, c.max_positions});
  embrope::RopeCache gpu_cache({c.rotary_dim, c.base, c.max_positions}, Device::cuda(0));

  auto views = [&](void* base, void* out_base, Device d, embrope::RopeOptions& o) {
    Tensor q(base, c.dtype, {tokens, c.hq, c.head_dim}, {token_stride, row, 1}, d);
    Tensor k(static_cast<unsigned char*>(base) + c.hq * row * es, c.dtype,
             {tokens, c.hk, c.head_dim}, {token_stride, row, 1}, d);
    if (!in_place) {
      o.q_out = Tensor(out_base, c.dtype, {tokens, c.hq, c.head_dim}, {token_stride, row, 1}, d);
      o.k_out = Tensor(static_cast<unsigned char*>(out_base) + c.hq * row * es, c.dtype,
                       {tokens, c.hk, c.head_dim}, {token_stride, row, 1}, d);
    }
    return std::make_pair(q, k);
  };
  embrope::RopeOptions cpu_opts, gpu_opts;
  cpu_opts.layout = gpu_opts.layout =
      c.interleaved ? embrope::RopeLayout::interleaved : embrope::RopeLayout::neox;
  auto [cq, ck] = views(qkv.host.data(), out.host.data(), Device::cpu(), cpu_opts);
  auto [gq, gk] = views(qkv.device, out.device, Device::cuda(0), gpu_opts);
  embrope::apply_rope(cq, ck, Tensor(pos.host.data(), DType::int64, {tokens}), cpu_cache, cpu_opts);
  embrope::apply_rope(gq, gk, Tensor(pos.device, DType::int64, {tokens}, Device::cuda(0)),
                      gpu_cache, gpu_opts);
  cuda_check(cudaDeviceSynchronize());
  const Buffer& result = in_place ? qkv : out;
  compare_rows(result.download(), result.host, c.dtype, elements, row);
}

// EMBROPE_GPU_SWEEP=reduced (set under compute-sanitizer, which slows every launch down)
// keeps the sweep's decode token counts (1 and 64) and drops 3 and 4097.
bool reduced_sweep() {
  const char* v = std::getenv("EMBROPE_GPU_SWEEP");
  return v != nullptr && std::string(v) == "reduced";
}

}  // namespace

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
                  RopeCase c;
                  c.dtype = dtype;
                  c.interleaved = layout == embrope::RopeLayout::interleaved;
                  c.head_dim = d;
                  c.rotary_dim = partial ? d / 2 : d;
                  c.hq = heads.first;
                  c.hk = heads.second;
                  c.seq = tokens;
                  c.arrangement = strided ? Arrangement::fused_qkv : Arrangement::contiguous;
                  c.out_of_place = !in_place;
                  c.max_positions = 5000;
                  run_rope_case(c);
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

TEST_CASE("GPU mrope equals CPU mrope, including chunks that straddle a section",
          "[gpu][rope][mrope]") {
  // The shapes and sections; dtype, layout and token count vary below.
  auto shape = [](std::int64_t head_dim, std::int64_t rotary_dim,
                  std::array<std::int64_t, 3> section) {
    MropeCase c;
    c.head_dim = head_dim;
    c.rotary_dim = rotary_dim;
    c.section = section;
    c.hq = 7;
    c.hk = 2;
    c.max_positions = 3000;
    return c;
  };
  // The last two interleave the streams (Qwen3-VL): no chunk of pairs shares one stream.
  auto interleaved_shape = [&](std::int64_t head_dim, std::int64_t rotary_dim,
                               std::array<std::int64_t, 3> section) {
    MropeCase c = shape(head_dim, rotary_dim, section);
    c.streams_interleaved = true;
    return c;
  };
  const MropeCase all[] = {shape(128, 128, {16, 24, 24}), shape(128, 64, {10, 11, 11}),
                           shape(80, 80, {0, 20, 20}), interleaved_shape(128, 128, {24, 20, 20}),
                           interleaved_shape(128, 64, {12, 10, 10})};
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
      for (const MropeCase& shaped : all) {
        for (std::int64_t tokens : {1, 5, 300}) {
          MropeCase c = shaped;
          c.dtype = dtype;
          c.interleaved = layout == embrope::RopeLayout::interleaved;
          c.seq = tokens;
          INFO("dtype " << embrope::dtype_name(dtype) << " layout " << static_cast<int>(layout)
                        << " D " << c.head_dim << " R " << c.rotary_dim << " T " << tokens
                        << (c.streams_interleaved ? " streams interleaved" : ""));
          const int es = embrope::dtype_size(dtype);
          const std::int64_t hq = c.hq, hk = c.hk, d = c.head_dim;
          Buffer q(tokens * hq * d * es), k(tokens * hk * d * es), pos(3 * tokens * 8);
          fill_random(q, dtype, tokens * hq * d, 31 + tokens);
          fill_random(k, dtype, tokens * hk * d, 37 + tokens);
          std::mt19937_64 rng(tokens);
          for (std::int64_t i = 0; i < 3 * tokens; ++i) {
            const std::int64_t p = static_cast<std::int64_t>(rng() % c.max_positions);
            std::memcpy(pos.host.data() + 8 * i, &p, 8);
          }
          q.upload();
          k.upload();
          pos.upload();
          const embrope::RopeConfig config{c.rotary_dim, 1000000.0, c.max_positions};
          embrope::RopeCache cpu_cache(config);
          embrope::RopeCache gpu_cache(config, Device::cuda(0));
          embrope::RopeOptions opt;
          opt.layout = layout;
          opt.mrope_section = c.section;
          opt.mrope_interleaved = c.streams_interleaved;
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

TEST_CASE("GPU axial RoPE equals the CPU, with axial caches built on both", "[gpu][rope][axial]") {
  // The vision and diffusion shapes: Flux.1, Qwen2-VL's vision tower, Wan 2.1, FLUX.2's four
  // axes, a ViT's head dim 72 rotated in part, and head dims 64, 88 and 96 with two axes.
  struct Shape {
    std::int64_t head_dim;
    std::array<std::int64_t, 4> axes_dim;
  };
  const Shape shapes[] = {{128, {16, 56, 56, 0}},  {80, {40, 40, 0, 0}}, {128, {44, 42, 42, 0}},
                          {128, {32, 32, 32, 32}}, {72, {16, 16, 0, 0}}, {64, {32, 32, 0, 0}},
                          {88, {44, 44, 0, 0}},    {96, {48, 48, 0, 0}}};
  const std::int64_t hq = 4, hk = 2, max_positions = 200;
  for (const Shape& shape : shapes) {
    std::vector<embrope::RopeConfig> axes;
    std::int64_t streams = 0;
    for (std::int64_t dim : shape.axes_dim) {
      if (dim == 0) continue;
      axes.push_back({dim, streams == 3 ? 2000.0 : 10000.0, max_positions});
      ++streams;
    }
    const embrope::RopeCache cpu_cache = embrope::RopeCache::axial(axes);
    const embrope::RopeCache gpu_cache = embrope::RopeCache::axial(axes, Device::cuda(0));
    {
      const std::int64_t half = cpu_cache.rotary_dim() / 2;
      std::vector<float> cos_cpu(max_positions * half), sin_cpu(cos_cpu.size());
      std::vector<float> cos_gpu(cos_cpu.size()), sin_gpu(cos_cpu.size());
      cpu_cache.copy_to_host(cos_cpu.data(), sin_cpu.data());
      gpu_cache.copy_to_host(cos_gpu.data(), sin_gpu.data());
      std::int64_t differ = 0;
      for (std::size_t i = 0; i < cos_cpu.size(); ++i) {
        differ += cos_cpu[i] != cos_gpu[i] || sin_cpu[i] != sin_gpu[i];
      }
      INFO("D " << shape.head_dim << ": table entries that differ");
      CHECK(differ == 0);
    }
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
      for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
        for (std::int64_t tokens : {1, 5, 300}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " layout " << static_cast<int>(layout)
                        << " D " << shape.head_dim << " axes " << streams << " T " << tokens);
          const int es = embrope::dtype_size(dtype);
          const std::int64_t d = shape.head_dim;
          Buffer q(tokens * hq * d * es), k(tokens * hk * d * es), pos(streams * tokens * 8);
          fill_random(q, dtype, tokens * hq * d, 41 + tokens);
          fill_random(k, dtype, tokens * hk * d, 43 + tokens);
          fill_positions(pos, streams * tokens, max_positions, tokens + 7);
          q.upload();
          k.upload();
          pos.upload();
          embrope::RopeOptions opt;
          opt.layout = layout;
          embrope::apply_rope(Tensor(q.host.data(), dtype, {tokens, hq, d}),
                              Tensor(k.host.data(), dtype, {tokens, hk, d}),
                              Tensor(pos.host.data(), DType::int64, {streams, tokens}), cpu_cache,
                              opt);
          const Device g = Device::cuda(0);
          embrope::apply_rope(Tensor(q.device, dtype, {tokens, hq, d}, g),
                              Tensor(k.device, dtype, {tokens, hk, d}, g),
                              Tensor(pos.device, DType::int64, {streams, tokens}, g), gpu_cache,
                              opt);
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

// A 16-bit table with activations of its dtype takes the fast path (rotary dims 128 and the
// generic size; the chunk's cos and sin one 8- or 16-byte load); other pairings, and a table
// whose rows are not aligned for those loads (a row stride of d / 2 + 1), the general path.
TEST_CASE("GPU RoPE with caller cos/sin tables of every value dtype", "[gpu][rope]") {
  for (DType table_dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
      for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
        for (std::int64_t d : {64, 128}) {
          for (std::int64_t pad : {0, 1}) {
            INFO("table " << embrope::dtype_name(table_dtype) << " q " << embrope::dtype_name(dtype)
                          << " interleaved " << (layout == embrope::RopeLayout::interleaved)
                          << " d " << d << " table row pad " << pad);
            const std::int64_t t = 33, h = 5, max_pos = 300, row = d / 2 + pad;
            const int es = embrope::dtype_size(dtype), ts = embrope::dtype_size(table_dtype);
            Buffer q(t * h * d * es), cos(max_pos * row * ts), sin(max_pos * row * ts), pos(t * 8);
            fill_random(q, dtype, t * h * d, 21);
            fill_random(cos, table_dtype, max_pos * row, 22);
            fill_random(sin, table_dtype, max_pos * row, 23);
            for (std::int64_t i = 0; i < t; ++i) {
              const std::int64_t p = (i * 37) % max_pos;
              std::memcpy(pos.host.data() + 8 * i, &p, 8);
            }
            for (Buffer* x : {&q, &cos, &sin, &pos}) x->upload();
            auto run = [&](bool gpu) {
              const Device dev = gpu ? Device::cuda(0) : Device::cpu();
              auto ptr = [&](Buffer& x) -> void* { return gpu ? x.device : x.host.data(); };
              embrope::RopeOptions opts;
              opts.layout = layout;
              embrope::apply_rope(Tensor(ptr(q), dtype, {t, h, d}, dev), std::nullopt,
                                  Tensor(ptr(pos), DType::int64, {t}, dev),
                                  Tensor(ptr(cos), table_dtype, {max_pos, d / 2}, {row, 1}, dev),
                                  Tensor(ptr(sin), table_dtype, {max_pos, d / 2}, {row, 1}, dev),
                                  opts);
            };
            run(false);
            run(true);
            cuda_check(cudaDeviceSynchronize());
            compare_rows(q.download(), q.host, dtype, t * h * d, d);
          }
        }
      }
    }
  }
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

TEST_CASE("GPU RoPE with float8 outputs equals the CPU, code for code", "[gpu][rope][float8]") {
  // The vector path (float32 cache, whole chunks), the general one (a bfloat16 caller table,
  // or outputs 4 bytes off the 8-byte alignment of a 16-bit input's chunk), partial rotary,
  // q and k heads of their own per-head scales (GQA), values past the float8 range
  // (saturation), and at 70 tokens a bad position (zero codes, reported by both).
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType out : {DType::float8_e4m3fn, DType::float8_e5m2}) {
      for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
        for (auto shape : {std::pair<std::int64_t, std::int64_t>{128, 128}, {96, 32}, {80, 80}}) {
          for (int variant : {0, 1, 2}) {  // cache; bfloat16 caller table; outputs off by 4
            for (std::int64_t t : {1, 70}) {
              const bool caller_table = variant == 1;
              const std::int64_t off = variant == 2 ? 4 : 0;
              const std::int64_t hq = 6, hk = 2, d = shape.first, r = shape.second, n = 512;
              INFO(embrope::dtype_name(dtype)
                   << " -> " << embrope::dtype_name(out)
                   << (layout == embrope::RopeLayout::neox ? " neox" : " interleaved") << " d " << d
                   << " r " << r << " variant " << variant << " T " << t);
              const int es = embrope::dtype_size(dtype);
              Buffer q(t * hq * d * es), k(t * hk * d * es), pos(t * 8);
              Buffer q_out(t * hq * d + off), k_out(t * hk * d + off);
              Buffer q_scales(hq * 4), k_scales(hk * 4);
              Buffer cos(n * r / 2 * 2), sin(n * r / 2 * 2);
              fill_random(q, dtype, t * hq * d, 31 + t);
              fill_random(k, dtype, t * hk * d, 32 + t);
              fill_random(cos, DType::bfloat16, n * r / 2, 33);
              fill_random(sin, DType::bfloat16, n * r / 2, 34);
              for (std::int64_t i = 0; i < t * hq * d; i += 5) {
                store_value(q.host.data(), dtype, i, 200.0f * load_value(q.host.data(), dtype, i));
              }
              for (std::int64_t i = 0; i < hq; ++i) {
                const float s = 0.25f * static_cast<float>(i + 1);
                std::memcpy(q_scales.host.data() + 4 * i, &s, 4);
              }
              for (std::int64_t i = 0; i < hk; ++i) {
                const float s = 3.0f - static_cast<float>(i);
                std::memcpy(k_scales.host.data() + 4 * i, &s, 4);
              }
              for (std::int64_t i = 0; i < t; ++i) {
                const std::int64_t p = i == 37 ? n + 5 : (i * 131 + 7) % n;
                std::memcpy(pos.host.data() + 8 * i, &p, 8);
              }
              for (Buffer* x : {&q, &k, &pos, &q_scales, &k_scales, &cos, &sin}) x->upload();
              q_out.poison_both(0x55);
              k_out.poison_both(0x55);
              embrope::RopeCache cpu_cache({r, 10000.0, n});
              embrope::RopeCache gpu_cache({r, 10000.0, n}, Device::cuda(0));
              auto run = [&](bool gpu) {
                const Device dev = gpu ? Device::cuda(0) : Device::cpu();
                auto ptr = [&](Buffer& x) -> void* { return gpu ? x.device : x.host.data(); };
                auto at = [&](Buffer& x) { return static_cast<unsigned char*>(ptr(x)) + off; };
                embrope::RopeOptions o;
                o.layout = layout;
                o.q_out = Tensor(at(q_out), out, {t, hq, d}, dev);
                o.k_out = Tensor(at(k_out), out, {t, hk, d}, dev);
                o.q_out_scale = 2.0f;
                o.k_out_scale = 0.5f;
                o.q_out_head_scales = Tensor(ptr(q_scales), DType::float32, {hq}, dev);
                o.k_out_head_scales = Tensor(ptr(k_scales), DType::float32, {hk}, dev);
                const Tensor qt(ptr(q), dtype, {t, hq, d}, dev), kt(ptr(k), dtype, {t, hk, d}, dev);
                const Tensor pt(ptr(pos), DType::int64, {t}, dev);
                try {
                  if (caller_table) {
                    embrope::apply_rope(qt, kt, pt,
                                        Tensor(ptr(cos), DType::bfloat16, {n, r / 2}, dev),
                                        Tensor(ptr(sin), DType::bfloat16, {n, r / 2}, dev), o);
                  } else {
                    embrope::apply_rope(qt, kt, pt, gpu ? gpu_cache : cpu_cache, o);
                  }
                  CHECK(t <= 37);
                } catch (const embrope::Error& e) {
                  CHECK(t > 37);
                  CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
                }
              };
              run(false);
              run(true);
              cuda_check(cudaDeviceSynchronize());
              // float32 arithmetic may differ in its last bit between the backends: a code
              // may then be its neighbour (same sign, one step), never further.
              for (const Buffer* b : {&q_out, &k_out}) {
                const std::vector<unsigned char> gpu = b->download();
                Mismatches mm;
                for (std::size_t i = 0; i < gpu.size(); ++i) {
                  const int g = gpu[i], c = b->host[i];
                  const bool ok = g == c || ((g ^ c) < 0x80 && (g - c == 1 || c - g == 1));
                  mm.check(ok, [&] {
                    return "byte " + std::to_string(i) + ": gpu code " + std::to_string(g) +
                           " cpu code " + std::to_string(c);
                  });
                }
                mm.require();
              }
              if (t > 37) {  // the bad token's rows: zero codes on both
                const std::size_t row = static_cast<std::size_t>(37 * hq * d + off);
                for (std::size_t i = row; i < row + static_cast<std::size_t>(hq * d); ++i) {
                  REQUIRE(q_out.host[i] == 0);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("GPU RoPE float8 outputs with non-rotary tensors (DeepSeek MLA) equal the CPU",
          "[gpu][rope][float8]") {
  // mla_rope_quantize_fp8's shapes: q [T, H, 128 | 64] (q_nope, then the rope slice, views of
  // one tensor), kv_a [T, 512 | 64] (kv_c as k_nope, k_pe as k, one head), bfloat16 in,
  // float8 out with per-head scales; the vector path (float32 cache) and the general one (a
  // bfloat16 caller table); at 40 tokens a bad position at token 20. The non-rotary codes
  // must be equal; the rotated ones equal or neighbours (float32 rotation).
  for (DType out : {DType::float8_e4m3fn, DType::float8_e5m2}) {
    for (bool caller_table : {false, true}) {
      for (std::int64_t t : {1, 40}) {
        INFO(embrope::dtype_name(out) << (caller_table ? " caller table" : " cache") << " T " << t);
        const std::int64_t h = 4, nope = 128, rope = 64, rank = 512, n = 256;
        const std::int64_t qd = nope + rope, kd = rank + rope;
        const DType dt = DType::bfloat16;
        Buffer q(t * h * qd * 2), kv(t * kd * 2), pos(t * 8), q_scales(h * 4);
        Buffer q_out(t * h * rope), k_out(t * rope), qn_out(t * h * nope), kn_out(t * rank);
        Buffer cos(n * rope / 2 * 2), sin(n * rope / 2 * 2);
        fill_random(q, dt, t * h * qd, 41 + t);
        fill_random(kv, dt, t * kd, 42 + t);
        fill_random(cos, dt, n * rope / 2, 43);
        fill_random(sin, dt, n * rope / 2, 44);
        for (std::int64_t i = 0; i < t * h * qd; i += 9) {
          store_value(q.host.data(), dt, i, 300.0f * load_value(q.host.data(), dt, i));
        }
        for (std::int64_t i = 0; i < h; ++i) {
          const float s = 0.5f * static_cast<float>(i + 1);
          std::memcpy(q_scales.host.data() + 4 * i, &s, 4);
        }
        for (std::int64_t i = 0; i < t; ++i) {
          const std::int64_t p = i == 20 ? n + 1 : (i * 61 + 3) % n;
          std::memcpy(pos.host.data() + 8 * i, &p, 8);
        }
        for (Buffer* x : {&q, &kv, &pos, &q_scales, &cos, &sin}) x->upload();
        for (Buffer* x : {&q_out, &k_out, &qn_out, &kn_out}) x->poison_both(0x55);
        embrope::RopeCache cpu_cache({rope, 10000.0, n});
        embrope::RopeCache gpu_cache({rope, 10000.0, n}, Device::cuda(0));
        auto run = [&](bool gpu) {
          const Device dev = gpu ? Device::cuda(0) : Device::cpu();
          auto at = [&](Buffer& x, std::int64_t bytes) {
            return static_cast<unsigned char*>(gpu ? x.device : x.host.data()) + bytes;
          };
          auto view = [&](void* p, DType d, std::vector<std::int64_t> shape,
                          std::vector<std::int64_t> strides) {
            return Tensor(p, d, static_cast<int>(shape.size()), shape.data(), strides.data(), dev);
          };
          embrope::RopeOptions o;
          o.layout = embrope::RopeLayout::interleaved;
          o.q_out = Tensor(at(q_out, 0), out, {t, h, rope}, dev);
          o.k_out = Tensor(at(k_out, 0), out, {t, 1, rope}, dev);
          o.q_out_scale = 2.0f;
          o.k_out_scale = 0.25f;
          o.q_out_head_scales = Tensor(at(q_scales, 0), DType::float32, {h}, dev);
          o.q_nope = view(at(q, 0), dt, {t, h, nope}, {h * qd, qd, 1});
          o.q_nope_out = Tensor(at(qn_out, 0), out, {t, h, nope}, dev);
          o.k_nope = view(at(kv, 0), dt, {t, 1, rank}, {kd, rank, 1});
          o.k_nope_out = Tensor(at(kn_out, 0), out, {t, 1, rank}, dev);
          const Tensor qt = view(at(q, nope * 2), dt, {t, h, rope}, {h * qd, qd, 1});
          const Tensor kt = view(at(kv, rank * 2), dt, {t, 1, rope}, {kd, rope, 1});
          const Tensor pt(at(pos, 0), DType::int64, {t}, dev);
          try {
            if (caller_table) {
              embrope::apply_rope(qt, kt, pt, Tensor(at(cos, 0), dt, {n, rope / 2}, dev),
                                  Tensor(at(sin, 0), dt, {n, rope / 2}, dev), o);
            } else {
              embrope::apply_rope(qt, kt, pt, gpu ? gpu_cache : cpu_cache, o);
            }
            CHECK(t <= 20);
          } catch (const embrope::Error& e) {
            CHECK(t > 20);
            CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
          }
        };
        run(false);
        run(true);
        cuda_check(cudaDeviceSynchronize());
        CHECK(qn_out.download() == qn_out.host);
        CHECK(kn_out.download() == kn_out.host);
        for (const Buffer* b : {&q_out, &k_out}) {
          const std::vector<unsigned char> gpu = b->download();
          Mismatches mm;
          for (std::size_t i = 0; i < gpu.size(); ++i) {
            const int g = gpu[i], c = b->host[i];
            mm.check(g == c || ((g ^ c) < 0x80 && (g - c == 1 || c - g == 1)), [&] {
              return "byte " + std::to_string(i) + ": gpu " + std::to_string(g) + " cpu " +
                     std::to_string(c);
            });
          }
          mm.require();
        }
        if (t > 20) {  // the bad token's non-rotary rows: zero codes
          for (std::int64_t i = 0; i < h * nope; ++i) REQUIRE(qn_out.host[20 * h * nope + i] == 0);
          for (std::int64_t i = 0; i < rank; ++i) REQUIRE(kn_out.host[20 * rank + i] == 0);
        }
      }
    }
  }
}

#if __has_include(<simt/simt.h>)
// The emulated device's memory model (its coalescing profiler, the one scripts/gpu-model-check.sh
// reads): compiled only against the emulator, which counts the 32-byte sectors each launch
// touches. On a GPU this case does not exist (Nsight Compute measures the real thing).
#include <simt/simt.h>

namespace {

struct LaunchSectors {
  long long load_sectors, store_sectors, load_bytes, store_bytes;
};

// One in-place bfloat16 RoPE launch of q and k [T, 24, 128] (Flux.1's attention), positions
// [streams, T] below max_positions, with the sectors the launch moves.
LaunchSectors flux_shaped_launch(const embrope::RopeCache& cache, std::int64_t streams,
                                 std::int64_t max_positions) {
  const std::int64_t tokens = 48, heads = 24, d = 128;
  const DType dtype = DType::bfloat16;
  Buffer q(tokens * heads * d * 2), k(tokens * heads * d * 2), pos(streams * tokens * 8);
  fill_random(q, dtype, tokens * heads * d, 3);
  fill_random(k, dtype, tokens * heads * d, 4);
  fill_positions(pos, streams * tokens, max_positions, 5);
  q.upload();
  k.upload();
  pos.upload();
  const Device g = Device::cuda(0);
  const Tensor positions = streams == 1 ? Tensor(pos.device, DType::int64, {tokens}, g)
                                        : Tensor(pos.device, DType::int64, {streams, tokens}, g);
  embrope::apply_rope(Tensor(q.device, dtype, {tokens, heads, d}, g),
                      Tensor(k.device, dtype, {tokens, heads, d}, g), positions, cache);
  cuda_check(cudaDeviceSynchronize());
  simt_coalesce_stats loads{}, stores{};
  REQUIRE(simt_coalesce_last(0, &loads) == 1);
  REQUIRE(simt_coalesce_last(1, &stores) == 1);
  return {loads.footprint_sectors, stores.footprint_sectors, loads.footprint_bytes,
          stores.footprint_bytes};
}

}  // namespace

TEST_CASE("GPU axial RoPE moves the bytes of the language-model RoPE (emulated memory model)",
          "[gpu][rope][axial][model]") {
  // Flux.1's axes [16, 56, 56] against one 128-feature RoPE of the same q and k: the rotation
  // reads and writes every q and k byte once in both; the axial launch reads one position per
  // axis and one table row per axis (cos and sin of 8, 28 and 28 pairs), where the
  // language-model launch reads one position and one row of 64 pairs.
  simt_coalesce_enable();
  const std::int64_t max_positions = 64;
  const embrope::RopeCache flux = embrope::RopeCache::axial(
      {{16, 10000.0, max_positions}, {56, 10000.0, max_positions}, {56, 10000.0, max_positions}},
      Device::cuda(0));
  const embrope::RopeCache language({128, 10000.0, max_positions}, Device::cuda(0));
  const LaunchSectors axial = flux_shaped_launch(flux, 3, max_positions);
  const LaunchSectors plain = flux_shaped_launch(language, 1, max_positions);
  const long long qk_bytes = 2LL * 48 * 24 * 128 * 2;
  INFO("axial: load sectors " << axial.load_sectors << " (" << axial.load_bytes
                              << " distinct bytes), store sectors " << axial.store_sectors
                              << "; language model: load sectors " << plain.load_sectors << " ("
                              << plain.load_bytes << " bytes), store sectors "
                              << plain.store_sectors << "; q and k " << qk_bytes << " bytes");
  // Stores: q and k once, in whole sectors, the same sectors in both (beside them, one
  // sector of the call's status word).
  CHECK(axial.store_sectors == plain.store_sectors);
  CHECK(axial.store_sectors * 32 >= qk_bytes);
  CHECK(axial.store_sectors * 32 <= qk_bytes + 32);
  // Loads: q and k once, plus the positions and the table rows. The axial launch reads two
  // more position streams and rows split at axis boundaries that are not sector-aligned: at
  // most 1% more sectors than the language-model launch (measured: 0.2%), and its sectors
  // used to 99% or more of their bytes, so both are bound by the same bytes.
  CHECK(plain.load_sectors * 32 >= qk_bytes);
  CHECK(static_cast<double>(axial.load_sectors) <= 1.01 * static_cast<double>(plain.load_sectors));
  CHECK(static_cast<double>(axial.load_bytes) >=
        0.99 * 32.0 * static_cast<double>(axial.load_sectors));
}
#endif
