// apply_rope_append_kv on the GPU against the CPU: q (or q_out), k_out and both caches must
// hold the same bytes (both backends round once through the same detail/ arithmetic, and the
// CPU path is itself checked against float64 references and the unfused pair). Paged NHD/HND
// and combined caches, contiguous caches from packed inputs, every cache dtype, page sizes
// 1/16/64, partial rotary and odd sizes (the general path), mrope, decode and prefill launch
// shapes, skipped and bad slots with deferred reporting. apply_qk_norm_rope_append_kv (norm)
// alike: weights in float32 or the activations' dtype, Gemma's 1 + w, the same caches.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_support.hpp"

using namespace gpu_test;
using embrope::KvCache;
using embrope::KvCacheLayout;
using embrope::KvSlots;

namespace {

struct AppendCase {
  DType dtype = DType::bfloat16, cache_dtype = DType::bfloat16;
  KvCacheLayout layout = KvCacheLayout::nhd;
  bool interleaved = false, combined = false, k_out = false, q_out = false, mrope = false;
  bool packed_offsets = false;  // contiguous cache [B, max_len] with cu_seqlens
  std::int64_t tokens = 64, hq = 8, hk = 2, head_dim = 128, rotary_dim = 128, v_dim = 128;
  std::int64_t page_size = 16;
  float k_scale = 1.0f, v_scale = 1.0f;
  std::int64_t bad_slot_token = -1;      // a slot past the cache at this token
  std::int64_t bad_position_token = -1;  // a position past the table at this token
  // apply_qk_norm_rope_append_kv: weights of norm_dtype, or 1 + w.
  bool norm = false, unit_offset = false;
  DType norm_dtype = DType::float32;
  // A float8 q_out (q_out set) with a scale and per-head scales; q_nope: q's non-rotary part
  // [T, Hq, 24] held apart (apply_rope_append_kv).
  DType q_dtype = DType::float32;  // float8: the q_out dtype
  bool q_nope = false;
  // A caller's cos/sin table of this dtype (random values, apply_rope_append_kv) in place of
  // the RopeCache.
  std::optional<DType> table_dtype;
};

std::string describe(const AppendCase& c) {
  std::ostringstream os;
  os << embrope::dtype_name(c.dtype) << " -> " << embrope::dtype_name(c.cache_dtype)
     << (c.layout == KvCacheLayout::nhd ? " NHD" : " HND") << (c.combined ? " combined" : "")
     << (c.interleaved ? " interleaved" : " neox") << (c.mrope ? " mrope" : "")
     << (c.packed_offsets ? " contiguous-packed" : " paged") << " T " << c.tokens << " Hq " << c.hq
     << " Hk " << c.hk << " D " << c.head_dim << " R " << c.rotary_dim << " Dv " << c.v_dim
     << " page " << c.page_size << (c.k_out ? " k_out" : "") << (c.q_out ? " q_out" : "")
     << (embrope::is_float8_dtype(c.q_dtype) ? embrope::dtype_name(c.q_dtype) : "")
     << (c.q_nope ? " q_nope" : "") << " bad slot at " << c.bad_slot_token << " bad position at "
     << c.bad_position_token;
  if (c.norm) {
    os << " qk-norm " << embrope::dtype_name(c.norm_dtype) << (c.unit_offset ? " 1 + w" : "");
  }
  return os.str();
}

std::vector<std::int64_t> cache_shape(const AppendCase& c, std::int64_t pages, std::int64_t d) {
  return c.layout == KvCacheLayout::nhd ? std::vector<std::int64_t>{pages, c.page_size, c.hk, d}
                                        : std::vector<std::int64_t>{pages, c.hk, c.page_size, d};
}

// The bytes a call leaves in its outputs, and its bad-index report.
struct Result {
  std::vector<unsigned char> q, k_out, k_cache, v_cache, q_nope_out;
  std::string error;
};

void run_case(const AppendCase& c) {
  INFO(describe(c));
  const std::int64_t t = c.tokens;
  const int es = embrope::dtype_size(c.dtype), cs = embrope::dtype_size(c.cache_dtype);
  const std::int64_t sequences = 3;
  const std::int64_t pages = c.packed_offsets ? sequences : (t + c.page_size - 1) / c.page_size + 2;
  const std::int64_t k_elems = pages * c.page_size * c.hk * c.head_dim;
  const std::int64_t v_elems = pages * c.page_size * c.hk * c.v_dim;
  Buffer q(t * c.hq * c.head_dim * es), k(t * c.hk * c.head_dim * es), v(t * c.hk * c.v_dim * es);
  const bool q8 = embrope::is_float8_dtype(c.q_dtype);
  const std::int64_t nope_dim = c.q_nope ? 24 : 0;
  Buffer q_out(c.q_out ? t * c.hq * c.head_dim * (q8 ? 1 : es) : 0),
      k_out(c.k_out ? t * c.hk * c.head_dim * es : 0);
  Buffer q_nope(t * c.hq * nope_dim * es), q_nope_out(t * c.hq * nope_dim);
  Buffer q_scales(c.hq * 4);
  fill_random(q_nope, c.dtype, t * c.hq * nope_dim, 16 + t);
  for (std::int64_t h = 0; h < c.hq; ++h) {
    const float scale = 0.25f + 0.5f * static_cast<float>(h % 4);
    std::memcpy(q_scales.host.data() + 4 * h, &scale, 4);
  }
  Buffer positions(3 * t * 8), slots(t * 8), offsets(sequences * 8), cu((sequences + 1) * 8);
  Buffer k_cache((c.combined ? 2 * k_elems : k_elems) * cs), v_cache(c.combined ? 0 : v_elems * cs);
  fill_random(q, c.dtype, t * c.hq * c.head_dim, 11 + t);
  fill_random(k, c.dtype, t * c.hk * c.head_dim, 12 + t);
  fill_random(v, c.dtype, t * c.hk * c.v_dim, 13 + t);
  const int ws = embrope::dtype_size(c.norm_dtype);
  Buffer q_weight(c.head_dim * ws), k_weight(c.head_dim * ws);
  fill_random(q_weight, c.norm_dtype, c.head_dim, 14 + t);
  fill_random(k_weight, c.norm_dtype, c.head_dim, 15 + t);
  // Positions (three streams for mrope), slots: a shuffled set with every seventh token
  // skipped; contiguous: three sequences of a packed batch at offsets of their own.
  std::mt19937_64 rng(static_cast<std::uint64_t>(t * 31 + c.head_dim));
  for (std::int64_t i = 0; i < 3 * t; ++i) {
    std::int64_t p = static_cast<std::int64_t>(rng() % 256);
    if (i % t == c.bad_position_token) p = 256;
    std::memcpy(positions.host.data() + 8 * i, &p, 8);
  }
  std::vector<std::int64_t> all(static_cast<std::size_t>(pages * c.page_size));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  for (std::int64_t i = 0; i < t; ++i) {
    std::int64_t s = i % 7 == 5 ? -1 : all[static_cast<std::size_t>(i)];
    if (i == c.bad_slot_token) s = pages * c.page_size;
    std::memcpy(slots.host.data() + 8 * i, &s, 8);
  }
  const std::int64_t cu_values[4] = {0, t / 3, t / 3, t};  // an empty middle sequence
  const std::int64_t offset_values[3] = {1, 0, c.page_size - (t - t / 3)};
  for (int i = 0; i < 4; ++i) std::memcpy(cu.host.data() + 8 * i, &cu_values[i], 8);
  for (int i = 0; i < 3; ++i) std::memcpy(offsets.host.data() + 8 * i, &offset_values[i], 8);
  for (Buffer* b :
       {&q, &k, &v, &positions, &slots, &offsets, &cu, &q_weight, &k_weight, &q_nope, &q_scales}) {
    b->upload();
  }

  const embrope::RopeConfig config{c.rotary_dim, 10000.0, 256};
  embrope::RopeCache cpu_cache(config), gpu_cache(config, Device::cuda(0));
  const DType table_dtype = c.table_dtype.value_or(DType::float32);
  const std::int64_t table_values = 256 * (c.rotary_dim / 2);
  Buffer cos(c.table_dtype ? table_values * embrope::dtype_size(table_dtype) : 0),
      sin(c.table_dtype ? table_values * embrope::dtype_size(table_dtype) : 0);
  if (c.table_dtype) {
    fill_random(cos, table_dtype, table_values, 17 + t);
    fill_random(sin, table_dtype, table_values, 18 + t);
    cos.upload();
    sin.upload();
  }
  auto run = [&](bool gpu) {
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    // Fresh inputs (q is rotated in place) and poisoned outputs on the side that runs.
    std::vector<Buffer*> outputs = {&q_out, &k_out, &k_cache, &v_cache, &q_nope_out};
    for (Buffer* b : outputs) b->poison_both(0x7f);
    q.upload();
    auto ptr = [&](Buffer& b) -> void* {
      return gpu ? b.device : static_cast<void*>(b.host.data());
    };
    auto tensor = [&](Buffer& b, DType dt, std::vector<std::int64_t> shape) {
      return Tensor(ptr(b), dt, static_cast<int>(shape.size()), shape.data(), nullptr, dev);
    };
    std::vector<unsigned char> q_host = q.host;
    KvCache kv;
    if (c.combined) {
      std::vector<std::int64_t> shape = cache_shape(c, pages, c.head_dim);
      shape.insert(shape.begin() + 1, 2);
      kv = KvCache::combined(tensor(k_cache, c.cache_dtype, shape), c.layout, c.k_scale, c.v_scale);
    } else {
      kv.k = tensor(k_cache, c.cache_dtype, cache_shape(c, pages, c.head_dim));
      kv.v = tensor(v_cache, c.cache_dtype, cache_shape(c, pages, c.v_dim));
      kv.layout = c.layout;
      kv.k_scale = c.k_scale;
      kv.v_scale = c.v_scale;
    }
    const KvSlots s = c.packed_offsets
                          ? KvSlots::contiguous(tensor(offsets, DType::int64, {sequences}),
                                                tensor(cu, DType::int64, {sequences + 1}))
                          : KvSlots::paged(tensor(slots, DType::int64, {t}));
    embrope::RopeOptions o;
    o.layout = c.interleaved ? embrope::RopeLayout::interleaved : embrope::RopeLayout::neox;
    if (c.mrope) o.mrope_section = {c.rotary_dim / 4, c.rotary_dim / 8, c.rotary_dim / 8};
    if (c.q_out) o.q_out = tensor(q_out, q8 ? c.q_dtype : c.dtype, {t, c.hq, c.head_dim});
    if (q8) {
      o.q_out_scale = 3.0f;
      o.q_out_head_scales = tensor(q_scales, DType::float32, {c.hq});
    }
    if (c.q_nope) {
      o.q_nope = tensor(q_nope, c.dtype, {t, c.hq, nope_dim});
      o.q_nope_out = tensor(q_nope_out, c.q_dtype, {t, c.hq, nope_dim});
    }
    if (c.k_out) o.k_out = tensor(k_out, c.dtype, {t, c.hk, c.head_dim});
    embrope::DeferredStatus status(dev);
    o.deferred = &status;
    const Tensor q_t = tensor(q, c.dtype, {t, c.hq, c.head_dim});
    const Tensor k_t = tensor(k, c.dtype, {t, c.hk, c.head_dim});
    const Tensor v_t = tensor(v, c.dtype, {t, c.hk, c.v_dim});
    const Tensor p_t =
        c.mrope ? tensor(positions, DType::int64, {3, t}) : tensor(positions, DType::int64, {t});
    if (c.norm) {
      embrope::QkNorm n;
      n.q_weight = tensor(q_weight, c.norm_dtype, {c.head_dim});
      n.k_weight = tensor(k_weight, c.norm_dtype, {c.head_dim});
      n.unit_offset = c.unit_offset;
      embrope::apply_qk_norm_rope_append_kv(q_t, k_t, v_t, p_t, gpu ? gpu_cache : cpu_cache, kv, s,
                                            n, o);
    } else if (c.table_dtype) {
      embrope::apply_rope_append_kv(q_t, k_t, v_t, p_t,
                                    tensor(cos, table_dtype, {256, c.rotary_dim / 2}),
                                    tensor(sin, table_dtype, {256, c.rotary_dim / 2}), kv, s, o);
    } else {
      embrope::apply_rope_append_kv(q_t, k_t, v_t, p_t, gpu ? gpu_cache : cpu_cache, kv, s, o);
    }
    Result r;
    try {
      status.check();
    } catch (const embrope::Error& e) {
      r.error = e.what();
    }
    r.q = gpu ? q.download() : q.host;
    if (c.q_out) r.q = gpu ? q_out.download() : q_out.host;
    r.q_nope_out = gpu ? q_nope_out.download() : q_nope_out.host;
    r.k_out = gpu ? k_out.download() : k_out.host;
    r.k_cache = gpu ? k_cache.download() : k_cache.host;
    r.v_cache = gpu ? v_cache.download() : v_cache.host;
    q.host = q_host;  // undo the CPU's in-place rotation for the other run
    return r;
  };
  const Result cpu = run(false);
  const Result gpu = run(true);
  CHECK(gpu.error == cpu.error);
  if (c.bad_slot_token >= 0 || c.bad_position_token >= 0) CHECK(!cpu.error.empty());
  CHECK(gpu.q == cpu.q);
  CHECK(gpu.k_out == cpu.k_out);
  CHECK(gpu.k_cache == cpu.k_cache);
  CHECK(gpu.v_cache == cpu.v_cache);
  CHECK(gpu.q_nope_out == cpu.q_nope_out);
}

bool reduced_sweep() {
  const char* v = std::getenv("EMBROPE_GPU_SWEEP");
  return v != nullptr && std::string(v) == "reduced";
}

}  // namespace

TEST_CASE("GPU apply_rope_append_kv: dtypes, cache dtypes, layouts, page sizes", "[gpu]") {
  const bool reduced = reduced_sweep();
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType cache : {dtype, DType::float8_e4m3fn, DType::float8_e5m2}) {
      for (KvCacheLayout layout : {KvCacheLayout::nhd, KvCacheLayout::hnd}) {
        for (std::int64_t page_size : {1, 16, 64}) {
          if (reduced && page_size == 64) continue;
          AppendCase c;
          c.dtype = dtype;
          c.cache_dtype = cache;
          c.layout = layout;
          c.page_size = page_size;
          c.tokens = page_size == 1 ? 1 : 20;  // decode, and rows split over blocks
          c.hq = 4;
          c.hk = 2;
          c.head_dim = c.rotary_dim = c.v_dim = 64;
          if (embrope::is_float8_dtype(cache)) {
            c.k_scale = 0.03125f;
            c.v_scale = 1.5f;
          }
          run_case(c);
        }
      }
    }
  }
  // Prefill: a block per token with all of its rows (from 4 blocks per multiprocessor's worth
  // of tokens on: 528 on the emulated H100); below that a token's rows are split over blocks.
  AppendCase prefill;
  prefill.tokens = 560;
  prefill.hq = 16;
  prefill.hk = 4;
  prefill.head_dim = prefill.rotary_dim = prefill.v_dim = 64;
  run_case(prefill);
  AppendCase wide;  // float16 cache from float32 activations, interleaved, combined
  wide.dtype = DType::float32;
  wide.cache_dtype = DType::float16;
  wide.interleaved = true;
  wide.combined = true;
  wide.tokens = reduced ? 8 : 40;
  run_case(wide);
}

// A 16-bit table with activations of its dtype takes the vector path too (its chunks one 8- or
// 16-byte load; mrope chunks straddling a section, head dim 80's sections of 20/10/10 pairs,
// pair by pair); other pairings the general path.
TEST_CASE("GPU apply_rope_append_kv with caller cos/sin tables of every value dtype", "[gpu]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType table : {DType::float32, DType::float16, DType::bfloat16}) {
      for (bool interleaved : {false, true}) {
        for (bool mrope : {false, true}) {
          AppendCase c;
          c.dtype = c.cache_dtype = dtype;
          c.table_dtype = table;
          c.interleaved = interleaved;
          c.mrope = mrope;
          c.tokens = 20;
          c.hq = 4;
          c.hk = 2;
          c.head_dim = c.rotary_dim = c.v_dim = mrope ? 80 : 128;
          run_case(c);
        }
      }
    }
  }
}

TEST_CASE("GPU apply_rope_append_kv: general path, partial rotary, mrope, outputs, contiguous",
          "[gpu]") {
  AppendCase partial;  // GPT-NeoX partial rotary with k_out and q_out (vector path)
  partial.head_dim = partial.v_dim = 64;
  partial.rotary_dim = 16;
  partial.k_out = partial.q_out = true;
  partial.tokens = 9;
  run_case(partial);
  AppendCase odd;  // odd sizes: the general path, MLA-style v
  odd.dtype = DType::float16;
  odd.cache_dtype = DType::float8_e4m3fn;
  odd.head_dim = 34;
  odd.rotary_dim = 18;
  odd.v_dim = 7;
  odd.hq = 3;
  odd.hk = 1;
  odd.tokens = 10;
  odd.interleaved = true;
  odd.k_out = true;
  run_case(odd);
  AppendCase mrope;  // Qwen2-VL sections
  mrope.mrope = true;
  mrope.tokens = 12;
  mrope.hq = 4;
  mrope.head_dim = mrope.rotary_dim = mrope.v_dim = 128;
  run_case(mrope);
  AppendCase packed;  // contiguous cache from a packed batch
  packed.packed_offsets = true;
  packed.tokens = 15;
  packed.page_size = 32;
  packed.cache_dtype = DType::float8_e5m2;
  packed.k_scale = 0.5f;
  run_case(packed);
  for (DType q8 : {DType::float8_e4m3fn, DType::float8_e5m2}) {
    // A float8 q_out (rope_quantize_fp8_append_paged_kv_cache) with head scales, a float8
    // cache; MLA's shape with q_nope; and a bad position (zero codes) at a token whose slot is
    // written otherwise (every seventh token from the fifth has none): its k and v rows must
    // stay out of the cache.
    AppendCase fp8;
    fp8.q_out = true;
    fp8.q_dtype = q8;
    fp8.cache_dtype = q8;
    fp8.k_scale = 0.25f;
    fp8.tokens = 12;
    fp8.hq = 4;
    fp8.interleaved = q8 == DType::float8_e5m2;
    fp8.bad_position_token = 4;
    run_case(fp8);
    AppendCase mla;  // DeepSeek MLA: q's rope slice (64) with q_nope, k_pe one kv head, kv_c v
    mla.q_out = mla.q_nope = true;
    mla.q_dtype = q8;
    mla.hq = 4;
    mla.hk = 1;
    mla.head_dim = mla.rotary_dim = 64;
    mla.v_dim = 128;
    mla.interleaved = true;
    mla.tokens = 7;
    run_case(mla);
  }
  AppendCase bad;  // a bad slot: reported alike, the same rows written
  bad.tokens = 16;
  bad.bad_slot_token = 6;
  bad.head_dim = bad.rotary_dim = bad.v_dim = 64;
  run_case(bad);
}

TEST_CASE("GPU apply_qk_norm_rope_append_kv: dtypes, caches, norms, bad slots and positions",
          "[gpu]") {
  const bool reduced = reduced_sweep();
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType cache : {dtype, DType::float8_e4m3fn}) {
      for (KvCacheLayout layout : {KvCacheLayout::nhd, KvCacheLayout::hnd}) {
        for (std::int64_t tokens : {1, 20}) {  // decode and prefill
          if (reduced && layout == KvCacheLayout::hnd && tokens == 20) continue;
          AppendCase c;  // Qwen3: head_dim 128, GQA
          c.norm = true;
          c.dtype = dtype;
          c.cache_dtype = cache;
          c.layout = layout;
          c.tokens = tokens;
          c.hq = 4;
          c.hk = 2;
          c.norm_dtype = layout == KvCacheLayout::nhd ? DType::float32 : dtype;
          if (embrope::is_float8_dtype(cache)) {
            c.k_scale = 0.03125f;
            c.v_scale = 1.5f;
          }
          run_case(c);
        }
      }
    }
  }
  for (DType q8 : {DType::float8_e4m3fn, DType::float8_e5m2}) {
    for (std::int64_t tokens : {1, 20}) {  // a float8 q_out, decode and prefill
      AppendCase c;
      c.norm = true;
      c.q_out = true;
      c.q_dtype = q8;
      c.cache_dtype = DType::float8_e4m3fn;
      c.k_scale = 0.125f;
      c.tokens = tokens;
      c.hq = 4;
      c.bad_position_token = tokens == 20 ? 3 : -1;
      run_case(c);
    }
  }
  AppendCase gemma;  // Gemma 3: 1 + w, q_out and k_out, combined cache, interleaved pairs
  gemma.norm = gemma.unit_offset = true;
  gemma.norm_dtype = DType::bfloat16;
  gemma.q_out = gemma.k_out = true;
  gemma.combined = true;
  gemma.interleaved = true;
  gemma.tokens = 9;
  run_case(gemma);
  AppendCase odd;  // odd sizes (the scalar sum pass), partial rotary, MQA, Dv 7
  odd.norm = true;
  odd.dtype = DType::float16;
  odd.cache_dtype = DType::float8_e5m2;
  odd.head_dim = 34;
  odd.rotary_dim = 18;
  odd.v_dim = 7;
  odd.hq = 3;
  odd.hk = 1;
  odd.tokens = 10;
  run_case(odd);
  AppendCase mrope;  // Qwen3-VL's text model: mrope
  mrope.norm = true;
  mrope.mrope = true;
  mrope.tokens = 12;
  run_case(mrope);
  AppendCase packed;  // contiguous cache from a packed batch
  packed.norm = true;
  packed.packed_offsets = true;
  packed.tokens = 15;
  packed.page_size = 32;
  run_case(packed);
  // Prefill on the neox fast path: a block per token, its 16 + 2 * 4 rows in three rounds of
  // 8 (the rounds' node buffers alternating), a bad position among them.
  AppendCase prefill;
  prefill.norm = true;
  prefill.tokens = 560;
  prefill.hq = 16;
  prefill.hk = 4;
  prefill.head_dim = prefill.rotary_dim = prefill.v_dim = 64;
  prefill.bad_position_token = 300;
  run_case(prefill);
  AppendCase bad;  // a bad slot, then a bad position before it: the first bad token reported
  bad.norm = true;
  bad.tokens = 16;
  bad.bad_slot_token = 6;
  run_case(bad);
  bad.bad_position_token = 3;
  run_case(bad);
}

TEST_CASE("GPU apply_rope_append_kv: DeepSeek MLA through views (q's rope slice, latent cache)",
          "[gpu]") {
  // q [T, H, 128 + 64] rotated in its last 64 elements; k_pe and kv_c the two parts of
  // kv_a_proj's [T, 512 + 64] output, one kv head each; the latent cache [blocks, 16, 512 + 64]
  // as its kv_c part (v_cache) and k_pe part (k_cache). Interleaved pairs, bfloat16, and a
  // float8 cache with a scale.
  for (DType cache_dtype : {DType::bfloat16, DType::float8_e4m3fn}) {
    INFO(embrope::dtype_name(cache_dtype));
    const std::int64_t t = 12, h = 4, nope = 128, rope = 64, rank = 512, blocks = 2, bs = 16;
    const DType dt = DType::bfloat16;
    const int es = 2, cs = embrope::dtype_size(cache_dtype);
    Buffer q(t * h * (nope + rope) * es), kv_a(t * (rank + rope) * es), positions(t * 8),
        slots(t * 8), cache(blocks * bs * (rank + rope) * cs);
    fill_random(q, dt, t * h * (nope + rope), 71);
    fill_random(kv_a, dt, t * (rank + rope), 72);
    for (std::int64_t i = 0; i < t; ++i) {
      const std::int64_t p = (i * 37) % 256, s = i == 4 ? -1 : (i * 5) % (blocks * bs);
      std::memcpy(positions.host.data() + 8 * i, &p, 8);
      std::memcpy(slots.host.data() + 8 * i, &s, 8);
    }
    for (Buffer* b : {&kv_a, &positions, &slots}) b->upload();
    const embrope::RopeConfig config{rope, 10000.0, 256};
    embrope::RopeCache cpu_cache(config), gpu_cache(config, Device::cuda(0));
    auto run = [&](bool gpu) {
      const Device dev = gpu ? Device::cuda(0) : Device::cpu();
      cache.poison_both(0x7f);
      q.upload();
      const std::vector<unsigned char> q_host = q.host;
      auto at = [&](Buffer& b, std::int64_t byte_offset) {
        return static_cast<unsigned char*>(gpu ? b.device : static_cast<void*>(b.host.data())) +
               byte_offset;
      };
      auto view = [&](void* p, DType d, std::vector<std::int64_t> shape,
                      std::vector<std::int64_t> strides) {
        return Tensor(p, d, static_cast<int>(shape.size()), shape.data(), strides.data(), dev);
      };
      KvCache kv;
      kv.k = view(at(cache, rank * cs), cache_dtype, {blocks, bs, 1, rope},
                  {bs * (rank + rope), rank + rope, rope, 1});
      kv.v = view(at(cache, 0), cache_dtype, {blocks, bs, 1, rank},
                  {bs * (rank + rope), rank + rope, rank, 1});
      if (embrope::is_float8_dtype(cache_dtype)) kv.k_scale = kv.v_scale = 0.25f;
      embrope::RopeOptions o;
      o.layout = embrope::RopeLayout::interleaved;
      embrope::apply_rope_append_kv(
          view(at(q, nope * es), dt, {t, h, rope}, {h * (nope + rope), nope + rope, 1}),
          view(at(kv_a, rank * es), dt, {t, 1, rope}, {rank + rope, rope, 1}),
          view(at(kv_a, 0), dt, {t, 1, rank}, {rank + rope, rank, 1}),
          view(at(positions, 0), DType::int64, {t}, {1}), gpu ? gpu_cache : cpu_cache, kv,
          KvSlots::paged(view(at(slots, 0), DType::int64, {t}, {1})), o);
      std::pair<std::vector<unsigned char>, std::vector<unsigned char>> r{
          gpu ? q.download() : q.host, gpu ? cache.download() : cache.host};
      q.host = q_host;
      return r;
    };
    const auto cpu = run(false);
    const auto gpu = run(true);
    CHECK(gpu.first == cpu.first);
    CHECK(gpu.second == cpu.second);
    CHECK(cpu.first != q.host);  // rotated
  }
}
