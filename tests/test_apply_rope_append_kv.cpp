// apply_rope_append_kv (docs/ops.md): RoPE of q and k fused with the KV-cache write, against
// the float64 reference of tests/reference.hpp (rotate, then scatter by the slot rules) and
// against the unfused pair (apply_rope, then a copy into the cache by the reference
// encoders), which must give identical bytes. Paged NHD/HND, combined and separate caches,
// contiguous caches from [B, S] and packed inputs, every cache dtype, page sizes 1/16/64,
// partial rotary, GQA, v's own head dim, skipped and bad slots, a cache filled over several
// calls; float8 conversion over all 256 codes and at the rounding ties; argument errors.
// apply_qk_norm_rope_append_kv runs the same cases with a per-head RMSNorm (float64 reference:
// RMSNorm then rotation; unfused pair: apply_qk_norm_rope, then the copy).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DeferredStatus;
using embrope::DType;
using embrope::Error;
using embrope::ErrorCode;
using embrope::KvCache;
using embrope::KvCacheLayout;
using embrope::KvSlots;
using embrope::RopeCache;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::Tensor;

enum class SlotKind { paged, batched_offsets, packed_offsets };

struct KvCase {
  DType dtype = DType::float32;
  DType cache_dtype = DType::float32;
  DType index_dtype = DType::int64;
  KvCacheLayout layout = KvCacheLayout::nhd;
  SlotKind slots = SlotKind::paged;
  bool combined = false, interleaved = false, q_out = false, k_out = false;
  std::int64_t head_dim = 64, rotary_dim = 64, v_dim = 64, hq = 4, hk = 2;
  std::int64_t batch = 0, seq = 12;  // batch 0: [T, H, D] inputs
  std::int64_t page_size = 16, pages = 4;
  float k_scale = 1.0f, v_scale = 1.0f;
  std::vector<std::int64_t> slot_values;  // paged, flat over tokens; empty: drawn (some -1)
  std::vector<std::int64_t> offsets, cu;  // contiguous
  std::int64_t max_positions = 64;
  std::uint64_t seed = 1;
  // apply_qk_norm_rope_append_kv: weights of norm_dtype (none: 1), Gemma's 1 + w.
  bool norm = false, norm_weights = true, unit_offset = false;
  DType norm_dtype = DType::float32;
  double eps = 1e-6;
  // A float8 q_out (q_out set): its dtype, q_out_scale and per-head scales.
  std::optional<DType> q_float8;
  bool q_head_scales = false;
};

constexpr float kQOutScale = 2.5f;
// The per-head scales of a float8 q_out, head h (any Hq).
float q_head_scale(std::int64_t h) {
  return h % 3 == 0 ? 0.5f : h % 3 == 1 ? 1.0f : 3.0f;
}

std::string describe(const KvCase& c) {
  std::ostringstream os;
  os << embrope::dtype_name(c.dtype) << " -> " << embrope::dtype_name(c.cache_dtype) << ", "
     << (c.layout == KvCacheLayout::nhd ? "NHD" : "HND")
     << (c.slots == SlotKind::paged             ? ", paged"
         : c.slots == SlotKind::batched_offsets ? ", contiguous [B,S]"
                                                : ", contiguous packed")
     << (c.combined ? ", combined" : "") << (c.interleaved ? ", interleaved" : ", neox") << ", D "
     << c.head_dim << " R " << c.rotary_dim << " Dv " << c.v_dim << ", Hq " << c.hq << " Hk "
     << c.hk << ", B " << c.batch << " S " << c.seq << ", page_size " << c.page_size << ", pages "
     << c.pages << (c.q_out ? ", q_out" : "")
     << (c.q_float8 ? std::string(" ") + embrope::dtype_name(*c.q_float8) : std::string())
     << (c.q_head_scales ? " head scales" : "") << (c.k_out ? ", k_out" : "") << ", scales "
     << c.k_scale << "/" << c.v_scale;
  if (c.norm) {
    os << ", qk-norm " << (c.norm_weights ? embrope::dtype_name(c.norm_dtype) : "no") << " weights"
       << (c.unit_offset ? " 1 + w" : "") << " eps " << c.eps;
  }
  return os.str();
}

// The memory of one call: inputs, outputs and the cache, all host buffers.
struct KvMemory {
  std::int64_t tokens = 0;
  ref::Buffer q, k, v, q_out, k_out, positions, slots, offsets, cu, q_weight, k_weight;
  ref::Buffer q_scales;          // a float8 q_out's per-head scales
  ref::Buffer k_cache, v_cache;  // v_cache unused when combined (both in k_cache)
};

// Cache element (page, slot offset, head, e) of k (which = 0) or v (1) as an index into its
// buffer, for the case's layout and combined-ness.
std::int64_t cache_index(const KvCase& c, int which, std::int64_t page, std::int64_t off,
                         std::int64_t h, std::int64_t e) {
  const std::int64_t d = which == 0 || c.combined ? c.head_dim : c.v_dim;
  const std::int64_t inner =
      c.layout == KvCacheLayout::nhd ? (off * c.hk + h) * d + e : (h * c.page_size + off) * d + e;
  const std::int64_t page_elems = c.page_size * c.hk * d;
  if (c.combined) return (page * 2 + which) * page_elems + inner;
  return page * page_elems + inner;
}

std::vector<std::int64_t> cache_shape(const KvCase& c, std::int64_t d) {
  return c.layout == KvCacheLayout::nhd ? std::vector<std::int64_t>{c.pages, c.page_size, c.hk, d}
                                        : std::vector<std::int64_t>{c.pages, c.hk, c.page_size, d};
}

std::vector<std::int64_t> heads_shape(const KvCase& c, std::int64_t h, std::int64_t d) {
  if (c.batch == 0) return {c.seq, h, d};
  return {c.batch, c.seq, h, d};
}

KvMemory make_memory(KvCase& c) {
  KvMemory m;
  m.tokens = (c.batch == 0 ? 1 : c.batch) * c.seq;
  const std::int64_t t = m.tokens;
  m.q = ref::Buffer(c.dtype, t * c.hq * c.head_dim);
  m.k = ref::Buffer(c.dtype, t * c.hk * c.head_dim);
  m.v = ref::Buffer(c.dtype, t * c.hk * c.v_dim);
  ref::fill_random(m.q, ref::seed_of({static_cast<std::int64_t>(c.seed), 1}));
  ref::fill_random(m.k, ref::seed_of({static_cast<std::int64_t>(c.seed), 2}));
  ref::fill_random(m.v, ref::seed_of({static_cast<std::int64_t>(c.seed), 3}));
  m.q_out = ref::Buffer(c.q_float8.value_or(c.dtype), c.q_out ? m.q.size() : 0);
  m.q_scales = ref::Buffer(DType::float32, c.hq);
  for (std::int64_t h = 0; h < c.hq; ++h) m.q_scales.set(h, q_head_scale(h));
  m.k_out = ref::Buffer(c.dtype, c.k_out ? m.k.size() : 0);
  ref::poison(m.q_out);
  ref::poison(m.k_out);
  m.positions = ref::Buffer(c.index_dtype, t);
  ref::fill_random_indices(m.positions, ref::seed_of({static_cast<std::int64_t>(c.seed), 4}), 0,
                           c.max_positions - 1);
  if (c.slots == SlotKind::paged) {
    if (c.slot_values.empty()) {
      // Distinct slots in random order; every fifth token skipped (-1).
      std::vector<std::int64_t> all(static_cast<std::size_t>(c.pages * c.page_size));
      std::iota(all.begin(), all.end(), 0);
      std::mt19937_64 rng(c.seed * 7 + 3);
      std::shuffle(all.begin(), all.end(), rng);
      for (std::int64_t i = 0; i < t; ++i) {
        c.slot_values.push_back(i % 5 == 3 ? -1 : all[static_cast<std::size_t>(i)]);
      }
    }
    m.slots = ref::Buffer(c.index_dtype, t);
    for (std::int64_t i = 0; i < t; ++i)
      m.slots.set_index(i, c.slot_values[static_cast<std::size_t>(i)]);
  } else {
    m.offsets = ref::Buffer(c.index_dtype, static_cast<std::int64_t>(c.offsets.size()));
    for (std::size_t i = 0; i < c.offsets.size(); ++i) {
      m.offsets.set_index(static_cast<std::int64_t>(i), c.offsets[i]);
    }
    m.cu = ref::Buffer(c.index_dtype, static_cast<std::int64_t>(c.cu.size()));
    for (std::size_t i = 0; i < c.cu.size(); ++i)
      m.cu.set_index(static_cast<std::int64_t>(i), c.cu[i]);
  }
  const std::int64_t k_elems = c.pages * c.page_size * c.hk * c.head_dim;
  if (c.combined) {
    m.k_cache = ref::Buffer(c.cache_dtype, 2 * k_elems);
  } else {
    m.k_cache = ref::Buffer(c.cache_dtype, k_elems);
    m.v_cache = ref::Buffer(c.cache_dtype, c.pages * c.page_size * c.hk * c.v_dim);
  }
  ref::poison(m.k_cache);
  ref::poison(m.v_cache);
  if (c.norm && c.norm_weights) {
    m.q_weight = ref::Buffer(c.norm_dtype, c.head_dim);
    m.k_weight = ref::Buffer(c.norm_dtype, c.head_dim);
    ref::fill_random(m.q_weight, ref::seed_of({static_cast<std::int64_t>(c.seed), 5}));
    ref::fill_random(m.k_weight, ref::seed_of({static_cast<std::int64_t>(c.seed), 6}));
  }
  return m;
}

// The norm of a qk-norm case.
embrope::QkNorm qk_norm(const KvCase& c, KvMemory& m) {
  embrope::QkNorm n;
  if (c.norm_weights) {
    n.q_weight = ref::view(m.q_weight, 0, {c.head_dim});
    n.k_weight = ref::view(m.k_weight, 0, {c.head_dim});
  }
  n.eps = static_cast<float>(c.eps);
  n.unit_offset = c.unit_offset;
  return n;
}

// Row x normalised in float64 as a qk-norm case asks (x / sqrt(mean(x^2) + eps) * w), or x.
std::vector<double> normalized(const KvCase& c, const KvMemory& m, bool is_k,
                               std::vector<double> x) {
  if (!c.norm) return x;
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double rstd = 1.0 / std::sqrt(sum / static_cast<double>(x.size()) + c.eps);
  for (std::size_t j = 0; j < x.size(); ++j) {
    double w = 1.0;
    if (c.norm_weights) w = (is_k ? m.k_weight : m.q_weight).get(static_cast<std::int64_t>(j));
    x[j] *= rstd * (c.unit_offset ? 1.0 + w : w);
  }
  return x;
}

KvCache cache_views(const KvCase& c, KvMemory& m) {
  if (c.combined) {
    std::vector<std::int64_t> shape = cache_shape(c, c.head_dim);
    shape.insert(shape.begin() + 1, 2);
    return KvCache::combined(ref::view(m.k_cache, 0, shape), c.layout, c.k_scale, c.v_scale);
  }
  KvCache kv;
  kv.k = ref::view(m.k_cache, 0, cache_shape(c, c.head_dim));
  kv.v = ref::view(m.v_cache, 0, cache_shape(c, c.v_dim));
  kv.layout = c.layout;
  kv.k_scale = c.k_scale;
  kv.v_scale = c.v_scale;
  return kv;
}

KvSlots slot_views(const KvCase& c, KvMemory& m) {
  const std::vector<std::int64_t> token_shape =
      c.batch == 0 ? std::vector<std::int64_t>{c.seq} : std::vector<std::int64_t>{c.batch, c.seq};
  if (c.slots == SlotKind::paged) return KvSlots::paged(ref::view(m.slots, 0, token_shape));
  const Tensor offsets = ref::view(m.offsets, 0, {m.offsets.size()});
  if (c.slots == SlotKind::packed_offsets) {
    return KvSlots::contiguous(offsets, ref::view(m.cu, 0, {m.cu.size()}));
  }
  return KvSlots::contiguous(offsets);
}

RopeOptions rope_options(const KvCase& c, KvMemory& m) {
  RopeOptions o;
  o.layout = c.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  if (c.q_out) o.q_out = ref::view(m.q_out, 0, heads_shape(c, c.hq, c.head_dim));
  if (c.k_out) o.k_out = ref::view(m.k_out, 0, heads_shape(c, c.hk, c.head_dim));
  if (c.q_float8) {
    o.q_out_scale = kQOutScale;
    if (c.q_head_scales) o.q_out_head_scales = ref::view(m.q_scales, 0, {c.hq});
  }
  return o;
}

// The fused call.
void run_fused(const KvCase& c, KvMemory& m, const RopeCache& cache,
               DeferredStatus* deferred = nullptr) {
  RopeOptions o = rope_options(c, m);
  o.deferred = deferred;
  const Tensor q = ref::view(m.q, 0, heads_shape(c, c.hq, c.head_dim));
  const Tensor k = ref::view(m.k, 0, heads_shape(c, c.hk, c.head_dim));
  const Tensor v = ref::view(m.v, 0, heads_shape(c, c.hk, c.v_dim));
  const Tensor positions = ref::view(
      m.positions, 0,
      c.batch == 0 ? std::vector<std::int64_t>{c.seq} : std::vector<std::int64_t>{c.batch, c.seq});
  if (c.norm) {
    embrope::apply_qk_norm_rope_append_kv(q, k, v, positions, cache, cache_views(c, m),
                                          slot_views(c, m), qk_norm(c, m), o);
  } else {
    embrope::apply_rope_append_kv(q, k, v, positions, cache, cache_views(c, m), slot_views(c, m),
                                  o);
  }
}

// Where token t goes by the case's rules, computed here from the case's own numbers: page and
// offset, or page -1 (skipped or bad).
std::pair<std::int64_t, std::int64_t> expected_slot(const KvCase& c, std::int64_t t) {
  if (c.slots == SlotKind::paged) {
    const std::int64_t slot = c.slot_values[static_cast<std::size_t>(t)];
    if (slot < 0 || slot >= c.pages * c.page_size) return {-1, 0};
    return {slot / c.page_size, slot % c.page_size};
  }
  std::int64_t b = 0, s = t;
  if (c.slots == SlotKind::batched_offsets) {
    b = t / c.seq;
    s = t % c.seq;
  } else {
    while (b + 1 < static_cast<std::int64_t>(c.cu.size()) - 1 &&
           c.cu[static_cast<std::size_t>(b + 1)] <= t) {
      ++b;
    }
    s = t - c.cu[static_cast<std::size_t>(b)];
  }
  const std::int64_t at = c.offsets[static_cast<std::size_t>(b)] + s;
  if (at < 0 || at >= c.page_size) return {-1, 0};
  return {b, at};
}

// One cache element's expected bits from an activation value x (already in the activations'
// dtype): converted by the reference encoders, float8 as float32(x) / float32(scale).
std::uint64_t cache_bits(DType cache_dtype, double x, float scale) {
  ref::Buffer one(cache_dtype, 1);
  if (embrope::is_float8_dtype(cache_dtype)) {
    one.set_bits(0,
                 ref::encode_fp8(cache_dtype, static_cast<double>(static_cast<float>(x) / scale)));
  } else {
    one.set(0, x);
  }
  return one.bits(0);
}

// The whole check of one case: q (and k_out) against the float64 rotation, the cache against
// the reference scatter (k within the rotation's tolerance, v exactly, untouched slots still
// poisoned), and the cache and q bytes against the unfused pair.
void check_case(KvCase c) {
  INFO(describe(c));
  KvMemory m = make_memory(c);
  const KvMemory before = m;
  const RopeCache cache({c.rotary_dim, 10000.0, c.max_positions});
  run_fused(c, m, cache);

  ref::Mismatches mm;
  const std::int64_t r = c.rotary_dim, d = c.head_dim;
  std::vector<double> cv, sv, x(static_cast<std::size_t>(d)), mag;
  std::vector<bool> written_k(static_cast<std::size_t>(m.k_cache.size()), false);
  std::vector<bool> written_v(
      static_cast<std::size_t>(c.combined ? m.k_cache.size() : m.v_cache.size()), false);
  for (std::int64_t t = 0; t < m.tokens; ++t) {
    const std::int64_t p = before.positions.get_index(t);
    ref::rope_cos_sin(p, r, 10000.0, cv, sv);
    const auto [page, off] = expected_slot(c, t);
    for (std::int64_t h = 0; h < c.hq + c.hk; ++h) {
      const bool is_k = h >= c.hq;
      const std::int64_t hh = is_k ? h - c.hq : h;
      const std::int64_t heads = is_k ? c.hk : c.hq;
      const std::int64_t base = (t * heads + hh) * d;
      const ref::Buffer& in = is_k ? before.k : before.q;
      for (std::int64_t e = 0; e < d; ++e) x[static_cast<std::size_t>(e)] = in.get(base + e);
      const std::vector<double> y =
          ref::rope_rotate(normalized(c, before, is_k, x), r, c.interleaved, false, cv, sv, &mag);
      const double n = ref::norm(y);
      const ref::Buffer* out = is_k ? (c.k_out ? &m.k_out : nullptr) : (c.q_out ? &m.q_out : &m.q);
      for (std::int64_t e = 0; e < d; ++e) {
        const auto ue = static_cast<std::size_t>(e);
        // With the norm: its sum of squares and rstd carry a few float32 ulps (4e-6 of the
        // row's norm in float32; 16-bit: one ulp of the output and the float32 error of the
        // terms before the one rounding), pass-through elements too.
        const double tol = c.norm  ? (c.dtype == DType::float32
                                          ? 4e-6 * n
                                          : ref::ulp(c.dtype, y[ue]) +
                                               std::ldexp(std::max(mag[ue], std::fabs(y[ue])), -19))
                           : e < r ? ref::tolerance(c.dtype, y[ue], n, mag[ue])
                                   : 0.0;
        auto loc = [&] { return ref::where(is_k ? "k" : "q", {t, hh, e}); };
        if (!is_k && c.q_float8) {
          // float8(value * scale), rounded once from float32: within one float8 ulp and the
          // float32 error (no rounding to the activations' dtype in between).
          const double scale = kQOutScale * (c.q_head_scales ? q_head_scale(hh) : 1.0f);
          const double want = y[ue] * scale;
          const double f32 = c.norm ? 4e-6 * n : 8.0 * 6e-8 * mag[ue];
          mm.expect_close(loc, out->get(base + e), want,
                          ref::ulp(*c.q_float8, std::fabs(want) + f32 * scale) / 2 + f32 * scale);
        } else if (out != nullptr) {
          mm.expect_close(loc, out->get(base + e), y[ue], tol);
        }
        if (!is_k || page < 0) continue;
        const std::int64_t ci = cache_index(c, 0, page, off, hh, e);
        written_k[static_cast<std::size_t>(ci)] = true;
        auto cloc = [&] { return ref::where("k_cache", {page, off, hh, e}); };
        if (embrope::is_float8_dtype(c.cache_dtype)) {
          const double want = y[ue] / c.k_scale;
          const double fp8_tol = ref::ulp(c.cache_dtype, want) + tol / c.k_scale;
          mm.expect_close(cloc, m.k_cache.get(ci), want, fp8_tol);
        } else {
          mm.expect_close(cloc, m.k_cache.get(ci), y[ue],
                          tol + (c.cache_dtype != c.dtype ? ref::ulp(c.cache_dtype, y[ue]) : 0.0));
        }
      }
    }
    if (page < 0) continue;
    for (std::int64_t h = 0; h < c.hk; ++h) {
      for (std::int64_t e = 0; e < c.v_dim; ++e) {
        const std::int64_t ci = cache_index(c, 1, page, off, h, e);
        ref::Buffer& vc = c.combined ? m.k_cache : m.v_cache;
        written_v[static_cast<std::size_t>(ci)] = true;
        mm.expect_bits(
            [&] {
              return ref::where("v_cache", {page, off, h, e});
            },
            vc.bits(ci),
            cache_bits(c.cache_dtype, before.v.get((t * c.hk + h) * c.v_dim + e), c.v_scale));
      }
    }
  }
  // Every element no token targets keeps its poison.
  auto untouched = [&](const ref::Buffer& got, const ref::Buffer& old,
                       const std::vector<bool>& written_a, const std::vector<bool>* written_b) {
    for (std::int64_t i = 0; i < got.size(); ++i) {
      const auto ui = static_cast<std::size_t>(i);
      if (written_a[ui] || (written_b != nullptr && (*written_b)[ui])) continue;
      mm.expect_bits([&] { return "untouched cache element " + std::to_string(i); }, got.bits(i),
                     old.bits(i));
    }
  };
  if (c.combined) {
    untouched(m.k_cache, before.k_cache, written_k, &written_v);
  } else {
    untouched(m.k_cache, before.k_cache, written_k, nullptr);
    untouched(m.v_cache, before.v_cache, written_v, nullptr);
  }
  INFO(mm.first);
  CHECK(mm.count == 0);
  CHECK(mm.checked > 0);

  // The unfused pair: apply_rope (q in place or out, k out of place), or apply_qk_norm_rope
  // for a qk-norm case, then the reference copy of rotated k and of v into a second cache.
  // Same bytes everywhere.
  KvMemory u = before;
  ref::Buffer k_rot(c.dtype, u.k.size());
  RopeOptions o = rope_options(c, u);
  o.k_out = ref::view(k_rot, 0, heads_shape(c, c.hk, c.head_dim));
  RopeOptions q8;  // a float8 q_out: apply_rope of q alone into float8 (no qk-norm form)
  if (c.q_float8) {
    q8 = o;
    q8.k_out.reset();
    o.q_out.reset();
    o.q_out_scale = 1.0f;
    o.q_out_head_scales.reset();
  }
  const auto token_shape =
      c.batch == 0 ? std::vector<std::int64_t>{c.seq} : std::vector<std::int64_t>{c.batch, c.seq};
  if (c.norm) {
    embrope::apply_qk_norm_rope(ref::view(u.q, 0, heads_shape(c, c.hq, c.head_dim)),
                                ref::view(u.k, 0, heads_shape(c, c.hk, c.head_dim)),
                                ref::view(u.positions, 0, token_shape), cache, qk_norm(c, u), o);
  } else {
    embrope::apply_rope(ref::view(u.q, 0, heads_shape(c, c.hq, c.head_dim)),
                        ref::view(u.k, 0, heads_shape(c, c.hk, c.head_dim)),
                        ref::view(u.positions, 0, token_shape), cache, o);
    if (c.q_float8) {
      ref::Buffer q_in = before.q;
      embrope::apply_rope(ref::view(q_in, 0, heads_shape(c, c.hq, c.head_dim)), std::nullopt,
                          ref::view(u.positions, 0, token_shape), cache, q8);
    }
  }
  for (std::int64_t t = 0; t < m.tokens; ++t) {
    const auto [page, off] = expected_slot(c, t);
    if (page < 0) continue;
    for (std::int64_t h = 0; h < c.hk; ++h) {
      for (std::int64_t e = 0; e < d; ++e) {
        u.k_cache.set_bits(cache_index(c, 0, page, off, h, e),
                           cache_bits(c.cache_dtype, k_rot.get((t * c.hk + h) * d + e), c.k_scale));
      }
      ref::Buffer& vc = c.combined ? u.k_cache : u.v_cache;
      for (std::int64_t e = 0; e < c.v_dim; ++e) {
        vc.set_bits(
            cache_index(c, 1, page, off, h, e),
            cache_bits(c.cache_dtype, before.v.get((t * c.hk + h) * c.v_dim + e), c.v_scale));
      }
    }
  }
  CHECK(u.k_cache.snapshot() == m.k_cache.snapshot());
  CHECK(u.v_cache.snapshot() == m.v_cache.snapshot());
  if (!c.norm || !c.q_float8) {
    CHECK((c.q_out ? u.q_out : u.q).snapshot() == (c.q_out ? m.q_out : m.q).snapshot());
  }
  if (c.q_float8) CHECK(before.q.snapshot() == m.q.snapshot());  // q is only read
  if (c.k_out) CHECK(k_rot.snapshot() == m.k_out.snapshot());
  CHECK(before.k.snapshot() == m.k.snapshot());  // k is only read
  CHECK(before.v.snapshot() == m.v.snapshot());
}

}  // namespace

TEST_CASE("apply_rope_append_kv paged caches: layouts, dtypes, page sizes",
          "[apply_rope_append_kv]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (KvCacheLayout layout : {KvCacheLayout::nhd, KvCacheLayout::hnd}) {
      for (std::int64_t page_size : {1, 16, 64}) {
        KvCase c;
        c.dtype = c.cache_dtype = dtype;
        c.layout = layout;
        c.page_size = page_size;
        c.pages = (24 + page_size - 1) / page_size + 1;
        c.seq = 20;
        c.seed = static_cast<std::uint64_t>(page_size * 10 + static_cast<int>(dtype));
        check_case(c);
      }
    }
  }
}

TEST_CASE("apply_rope_append_kv cache dtypes: float8 with scales, 16-bit from float32",
          "[apply_rope_append_kv]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType cache : {DType::float8_e4m3fn, DType::float8_e5m2}) {
      KvCase c;
      c.dtype = dtype;
      c.cache_dtype = cache;
      c.k_scale = 0.0125f;
      c.v_scale = 0.75f;
      c.layout = cache == DType::float8_e5m2 ? KvCacheLayout::hnd : KvCacheLayout::nhd;
      check_case(c);
    }
  }
  for (DType cache : {DType::float16, DType::bfloat16}) {
    KvCase c;
    c.cache_dtype = cache;
    c.interleaved = true;
    check_case(c);
  }
}

TEST_CASE("apply_rope_append_kv shapes: partial rotary, GQA/MQA, v head dim, combined, outputs",
          "[apply_rope_append_kv]") {
  KvCase partial;  // GPT-NeoX style partial rotary, out of place q and k_out
  partial.head_dim = partial.v_dim = 80;
  partial.rotary_dim = 20;
  partial.q_out = partial.k_out = true;
  check_case(partial);
  KvCase gptj = partial;  // interleaved partial, combined cache
  gptj.interleaved = true;
  gptj.combined = true;
  gptj.rotary_dim = 32;
  gptj.dtype = gptj.cache_dtype = DType::bfloat16;
  check_case(gptj);
  KvCase mqa;  // one kv head, 8 q heads, int32 indices
  mqa.hq = 8;
  mqa.hk = 1;
  mqa.index_dtype = DType::int32;
  check_case(mqa);
  KvCase mla;  // v's head dim differs from k's
  mla.head_dim = 96;
  mla.rotary_dim = 64;
  mla.v_dim = 48;
  mla.hq = 2;
  mla.hk = 3;
  mla.dtype = mla.cache_dtype = DType::float16;
  check_case(mla);
  KvCase odd;  // odd sizes everywhere
  odd.head_dim = 34;
  odd.rotary_dim = 18;
  odd.v_dim = 7;
  odd.hq = 3;
  odd.hk = 1;
  odd.seq = 9;
  odd.interleaved = true;
  odd.cache_dtype = DType::float8_e4m3fn;
  odd.k_scale = 0.5f;
  check_case(odd);
  KvCase batched;  // [B, S, H, D] inputs, [B, S] slot_mapping
  batched.batch = 3;
  batched.seq = 5;
  batched.k_out = true;
  check_case(batched);
  KvCase no_q;  // no q heads
  no_q.hq = 0;
  check_case(no_q);
}

TEST_CASE("apply_rope_append_kv contiguous caches: per-sequence offsets, [B, S] and packed",
          "[apply_rope_append_kv]") {
  KvCase batched;
  batched.slots = SlotKind::batched_offsets;
  batched.batch = 3;
  batched.seq = 4;
  batched.pages = 4;  // a cache for up to 4 sequences
  batched.page_size = 16;
  batched.offsets = {0, 7, 12};
  check_case(batched);
  KvCase decode = batched;  // one token per sequence
  decode.seq = 1;
  decode.offsets = {15, 3, 0};
  decode.dtype = decode.cache_dtype = DType::bfloat16;
  check_case(decode);
  KvCase packed;
  packed.slots = SlotKind::packed_offsets;
  packed.seq = 11;
  packed.cu = {0, 4, 4, 11};  // an empty sequence in the middle
  packed.offsets = {2, 9, 5};
  packed.pages = 3;
  packed.page_size = 16;
  packed.cache_dtype = DType::float8_e5m2;
  check_case(packed);
}

TEST_CASE("apply_rope_append_kv fills one cache over several calls like one call",
          "[apply_rope_append_kv]") {
  // A prefill of 6 tokens then 3 decode steps of one token into a paged cache give the
  // cache one call over all 9 tokens gives.
  const std::int64_t hq = 4, hk = 2, d = 64, page_size = 4, pages = 4, total = 9;
  const RopeCache cache({d, 10000.0, 64});
  ref::Buffer q(DType::bfloat16, total * hq * d), k(DType::bfloat16, total * hk * d),
      v(DType::bfloat16, total * hk * d), pos(DType::int64, total), slots(DType::int64, total);
  ref::fill_random(q, 11);
  ref::fill_random(k, 12);
  ref::fill_random(v, 13);
  const std::int64_t page_of[3] = {2, 0, 3};  // the sequence's pages, in order
  for (std::int64_t t = 0; t < total; ++t) {
    pos.set_index(t, t);
    slots.set_index(t, page_of[t / page_size] * page_size + t % page_size);
  }
  auto run = [&](ref::Buffer& kc, ref::Buffer& vc, ref::Buffer& qq, std::int64_t first,
                 std::int64_t count) {
    KvCache kv;
    kv.k = ref::view(kc, 0, {pages, page_size, hk, d});
    kv.v = ref::view(vc, 0, {pages, page_size, hk, d});
    embrope::apply_rope_append_kv(
        ref::view(qq, first * hq * d, {count, hq, d}), ref::view(k, first * hk * d, {count, hk, d}),
        ref::view(v, first * hk * d, {count, hk, d}), ref::view(pos, first, {count}), cache, kv,
        KvSlots::paged(ref::view(slots, first, {count})));
  };
  ref::Buffer kc1(DType::bfloat16, pages * page_size * hk * d), vc1 = kc1;
  ref::poison(kc1);
  ref::poison(vc1);
  ref::Buffer kc2 = kc1, vc2 = vc1, q1 = q, q2 = q;
  run(kc1, vc1, q1, 0, total);
  run(kc2, vc2, q2, 0, 6);
  for (std::int64_t t = 6; t < total; ++t) run(kc2, vc2, q2, t, 1);
  CHECK(kc1.snapshot() == kc2.snapshot());
  CHECK(vc1.snapshot() == vc2.snapshot());
  CHECK(q1.snapshot() == q2.snapshot());
  ref::Buffer poisoned = kc1;
  ref::poison(poisoned);
  CHECK(kc1.snapshot() != poisoned.snapshot());  // the calls wrote something
}

TEST_CASE("apply_rope_append_kv reads a k broadcast over its heads as its copy",
          "[apply_rope_append_kv]") {
  // Without k_out, k is only read, so a view with stride 0 over the heads is a valid input
  // (it was refused as "k overlaps itself"); the caches get the same bytes as from k's copy.
  const std::int64_t t = 5, hq = 4, hk = 2, d = 64, pages = 2, page_size = 4;
  const RopeCache cache({d, 10000.0, 64});
  ref::Buffer q(DType::float32, t * hq * d), k_row(DType::float32, t * d),
      k_copy(DType::float32, t * hk * d), v(DType::float32, t * hk * d), pos(DType::int64, t),
      slots(DType::int64, t);
  ref::fill_random(q, 21);
  ref::fill_random(k_row, 22);
  ref::fill_random(v, 23);
  for (std::int64_t i = 0; i < t; ++i) {
    pos.set_index(i, 3 * i + 1);
    slots.set_index(i, 7 - i);
    for (std::int64_t h = 0; h < hk; ++h) {
      for (std::int64_t j = 0; j < d; ++j) k_copy.set((i * hk + h) * d + j, k_row.get(i * d + j));
    }
  }
  auto run = [&](const Tensor& k, ref::Buffer& kc, ref::Buffer& vc, ref::Buffer& qq) {
    KvCache kv;
    kv.k = ref::view(kc, 0, {pages, page_size, hk, d});
    kv.v = ref::view(vc, 0, {pages, page_size, hk, d});
    embrope::apply_rope_append_kv(ref::view(qq, 0, {t, hq, d}), k, ref::view(v, 0, {t, hk, d}),
                                  ref::view(pos, 0, {t}), cache, kv,
                                  KvSlots::paged(ref::view(slots, 0, {t})));
  };
  ref::Buffer kc1(DType::float32, pages * page_size * hk * d), vc1 = kc1;
  ref::poison(kc1);
  ref::poison(vc1);
  ref::Buffer kc2 = kc1, vc2 = vc1, q1 = q, q2 = q;
  const auto k_before = k_row.snapshot();
  run(ref::view(k_row, 0, {t, hk, d}, {d, 0, 1}), kc1, vc1, q1);
  run(ref::view(k_copy, 0, {t, hk, d}), kc2, vc2, q2);
  CHECK(k_row.snapshot() == k_before);  // read only
  CHECK(kc1.snapshot() == kc2.snapshot());
  CHECK(vc1.snapshot() == vc2.snapshot());
  CHECK(q1.snapshot() == q2.snapshot());
  ref::Buffer poisoned = kc1;
  ref::poison(poisoned);
  CHECK(kc1.snapshot() != poisoned.snapshot());  // the calls wrote the cache
}

TEST_CASE("apply_rope_append_kv float8: all 256 codes, ties, saturation, NaN",
          "[apply_rope_append_kv][float8]") {
  // v values go to the cache converted (k is irrelevant here: one pass-through element).
  for (DType fp8 : {DType::float8_e4m3fn, DType::float8_e5m2}) {
    INFO(embrope::dtype_name(fp8));
    std::vector<float> values;
    std::vector<std::uint8_t> want;
    const double max = ref::fp8_max(fp8);
    for (int code = 0; code < 256; ++code) {
      const auto c = static_cast<std::uint8_t>(code);
      const double x = ref::decode_fp8(fp8, c);
      values.push_back(static_cast<float>(x));
      // Every finite code round-trips; NaN stays NaN (0x7f with its sign, as PyTorch stores
      // it: e5m2 has three more NaN codes per sign, which come back as 0x7f); infinities
      // saturate to the largest finite value.
      if (ref::fp8_is_nan(fp8, c)) {
        want.push_back(static_cast<std::uint8_t>((c & 0x80) | 0x7f));
      } else if (std::isinf(x)) {
        want.push_back(static_cast<std::uint8_t>((c & 0x80) | 0x7b));
      } else {
        want.push_back(c);
      }
    }
    // Ties: the midpoint of each pair of neighbouring positive finite codes goes to the even
    // code; a float32 ulp either side goes to the nearer one.
    for (int code = 0; code + 1 < 0x80; ++code) {
      const double a = ref::decode_fp8(fp8, static_cast<std::uint8_t>(code));
      const double b = ref::decode_fp8(fp8, static_cast<std::uint8_t>(code + 1));
      if (!std::isfinite(b) || std::isnan(b)) break;
      const float mid = static_cast<float>((a + b) / 2);
      REQUIRE(static_cast<double>(mid) == (a + b) / 2);  // exact in float32
      values.push_back(mid);
      want.push_back(static_cast<std::uint8_t>(code % 2 == 0 ? code : code + 1));
      values.push_back(std::nextafter(mid, 0.0f));
      want.push_back(static_cast<std::uint8_t>(code));
      values.push_back(std::nextafter(mid, 1e30f));
      want.push_back(static_cast<std::uint8_t>(code + 1));
      values.push_back(-mid);
      want.push_back(static_cast<std::uint8_t>(0x80 | (code % 2 == 0 ? code : code + 1)));
    }
    // Past the largest finite value, and below half the smallest subnormal.
    const float beyond[] = {static_cast<float>(max) * 1.01f, 1e30f,     -1e30f,
                            static_cast<float>(max * 1.5),   -INFINITY, INFINITY};
    for (float f : beyond) {
      values.push_back(f);
      want.push_back(static_cast<std::uint8_t>((f < 0 ? 0x80 : 0) |
                                               (fp8 == DType::float8_e4m3fn ? 0x7e : 0x7b)));
    }
    const float tiny = static_cast<float>(ref::decode_fp8(fp8, 1)) / 2;  // a tie with 0: to 0
    values.push_back(tiny);
    want.push_back(0x00);
    values.push_back(-tiny);
    want.push_back(0x80);
    values.push_back(std::nextafter(tiny, 1.0f));
    want.push_back(0x01);
    values.push_back(std::numeric_limits<float>::denorm_min());
    want.push_back(0x00);
    values.push_back(std::nanf(""));
    want.push_back(0x7f);

    // The reference encoder agrees with these hand-derived expectations.
    for (std::size_t i = 0; i < values.size(); ++i) {
      INFO("value " << values[i]);
      REQUIRE(ref::encode_fp8(fp8, values[i]) == want[i]);
    }

    // Through the op: T tokens, one kv head, v rows of dv values.
    const std::int64_t dv = 16;
    const auto n = static_cast<std::int64_t>(values.size());
    const std::int64_t tokens = (n + dv - 1) / dv;
    ref::Buffer q(DType::float32, 0), k(DType::float32, tokens * 2), v(DType::float32, tokens * dv),
        pos(DType::int64, tokens), slots(DType::int64, tokens);
    ref::fill_random(k, 5);
    for (std::int64_t i = 0; i < tokens * dv; ++i) {
      v.set(i, i < n ? values[static_cast<std::size_t>(i)] : 0.0);
    }
    for (std::int64_t t = 0; t < tokens; ++t) {
      pos.set_index(t, t % 4);
      slots.set_index(t, t);
    }
    ref::Buffer kc(fp8, tokens * 2), vc(fp8, tokens * dv);
    KvCache kv;
    kv.k = ref::view(kc, 0, {tokens, 1, 1, 2});
    kv.v = ref::view(vc, 0, {tokens, 1, 1, dv});
    const RopeCache cache({2, 10000.0, 4});
    embrope::apply_rope_append_kv(ref::view(q, 0, {tokens, 0, 2}), ref::view(k, 0, {tokens, 1, 2}),
                                  ref::view(v, 0, {tokens, 1, dv}), ref::view(pos, 0, {tokens}),
                                  cache, kv, KvSlots::paged(ref::view(slots, 0, {tokens})));
    ref::Mismatches mm;
    for (std::int64_t i = 0; i < n; ++i) {
      mm.expect_bits([&] { return "value " + std::to_string(values[static_cast<std::size_t>(i)]); },
                     vc.bits(i), want[static_cast<std::size_t>(i)]);
    }
    INFO(mm.first);
    CHECK(mm.count == 0);
    CHECK(mm.checked == n);
  }
}

TEST_CASE("apply_rope_append_kv float8 q_out (rope_quantize_fp8_append_paged_kv_cache)",
          "[apply_rope_append_kv][float8]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType q8 : {DType::float8_e4m3fn, DType::float8_e5m2}) {
      KvCase c;
      c.dtype = dtype;
      c.cache_dtype = q8;  // the cache float8 too, with its own scale
      c.k_scale = 0.5f;
      c.q_out = true;
      c.q_float8 = q8;
      c.q_head_scales = dtype != DType::float32;
      c.interleaved = q8 == DType::float8_e5m2;
      c.seed = static_cast<std::uint64_t>(60 + static_cast<int>(dtype));
      check_case(c);
    }
  }
  KvCase partial;  // partial rotary (the rest quantized too), k_out in k's dtype, HND, GQA 6:2
  partial.dtype = partial.cache_dtype = DType::bfloat16;
  partial.q_out = partial.k_out = true;
  partial.q_float8 = DType::float8_e4m3fn;
  partial.head_dim = 96;
  partial.rotary_dim = 32;
  partial.hq = 6;
  partial.layout = KvCacheLayout::hnd;
  check_case(partial);
  for (bool norm : {false, true}) {
    // A bad position: its q_out row all zero codes, its cache rows unwritten, the other tokens
    // as in a call without it.
    KvCase c;
    c.norm = norm;
    c.dtype = DType::bfloat16;
    c.q_out = true;
    c.q_float8 = DType::float8_e5m2;
    c.seq = 6;
    KvMemory good = make_memory(c);
    KvMemory bad = good;
    const RopeCache cache({c.rotary_dim, 10000.0, c.max_positions});
    run_fused(c, good, cache);
    bad.positions.set_index(2, c.max_positions);
    DeferredStatus status;
    run_fused(c, bad, cache, &status);
    CHECK_THROWS_AS(status.check(), embrope::Error);
    const std::int64_t row = c.hq * c.head_dim;
    for (std::int64_t i = 0; i < bad.q_out.size(); ++i) {
      INFO("q_out element " << i << (norm ? ", qk-norm" : ""));
      CHECK(bad.q_out.bits(i) == (i / row == 2 ? 0u : good.q_out.bits(i)));
    }
  }
}

TEST_CASE("apply_rope_append_kv bad slots and positions: reported, rows not written",
          "[apply_rope_append_kv][errors]") {
  KvCase c;
  c.seq = 6;
  c.pages = 2;
  c.page_size = 4;
  c.slot_values = {0, 1, 9, -1, -2, 3};  // 9 is past the 8 slots, -2 is not -1
  KvMemory m = make_memory(c);
  const KvMemory before = m;
  const RopeCache cache({c.rotary_dim, 10000.0, c.max_positions});
  try {
    run_fused(c, m, cache);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::index_out_of_range);
    CHECK(ref::mentions(e.what(), "apply_rope_append_kv"));
    CHECK(ref::mentions(e.what(), "slot_mapping[2] = 9"));
    CHECK(ref::mentions(e.what(), "[0, 8)"));
  }
  // Slots 0, 1 and 3 written (tokens 0, 1, 5); the rest of the cache untouched.
  for (std::int64_t slot = 0; slot < 8; ++slot) {
    const bool written = slot == 0 || slot == 1 || slot == 3;
    const std::int64_t i = cache_index(c, 0, slot / 4, slot % 4, 0, 0);
    CHECK((m.k_cache.bits(i) != before.k_cache.bits(i)) == written);
  }
  // q of every token rotated (bad slots do not touch q).
  for (std::int64_t t = 0; t < c.seq; ++t)
    CHECK(m.q.bits(t * c.hq * 64) != before.q.bits(t * c.hq * 64));

  // A bad position with deferred reporting: q rows zero, no cache rows; the next call works.
  KvCase p = c;
  p.slot_values = {0, 1, 2, 3, 4, 5};
  KvMemory pm = make_memory(p);
  pm.positions.set_index(4, p.max_positions);
  DeferredStatus status;
  run_fused(p, pm, cache, &status);
  try {
    status.check();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(ref::mentions(e.what(), "positions[4] = 64"));
  }
  CHECK(pm.q.get(4 * p.hq * 64) == 0.0);
  CHECK(std::isnan(pm.k_cache.get(cache_index(p, 0, 1, 0, 0, 0))));   // slot 4: poison
  CHECK(!std::isnan(pm.k_cache.get(cache_index(p, 0, 1, 1, 0, 0))));  // slot 5: written

  // Contiguous: a write position past max_len.
  KvCase o;
  o.slots = SlotKind::batched_offsets;
  o.batch = 2;
  o.seq = 3;
  o.pages = 2;
  o.page_size = 8;
  o.offsets = {5, 6};  // sequence 1's third token would be row 8
  KvMemory om = make_memory(o);
  try {
    run_fused(o, om, cache);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(ref::mentions(e.what(), "cache_offsets[b] + s"));
    CHECK(ref::mentions(e.what(), "token 5"));
    CHECK(ref::mentions(e.what(), "= 8"));
  }
}

TEST_CASE("apply_rope_append_kv argument errors", "[apply_rope_append_kv][errors]") {
  KvCase c;
  KvMemory m = make_memory(c);
  const RopeCache cache({64, 10000.0, 64});
  const Tensor q = ref::view(m.q, 0, {12, 4, 64});
  const Tensor k = ref::view(m.k, 0, {12, 2, 64});
  const Tensor v = ref::view(m.v, 0, {12, 2, 64});
  const Tensor pos = ref::view(m.positions, 0, {12});
  const KvSlots slots = KvSlots::paged(ref::view(m.slots, 0, {12}));
  const KvCache kv = cache_views(c, m);
  auto expect = [&](const KvCache& kvc, const KvSlots& s, const Tensor& vv,
                    std::initializer_list<const char*> parts) {
    expect_error([&] { embrope::apply_rope_append_kv(q, k, vv, pos, cache, kvc, s); },
                 {ErrorCode::invalid_argument}, parts);
  };
  KvCache wrong_heads = kv;
  wrong_heads.k = ref::view(m.k_cache, 0, {4, 16, 1, 64});
  expect(wrong_heads, slots, v, {"apply_rope_append_kv", "k_cache", "kv_heads of k"});
  KvCache scaled = kv;
  scaled.k_scale = 2.0f;
  expect(scaled, slots, v, {"k_scale 2", "float8 caches only"});
  KvCache zero_scale = kv;
  zero_scale.v_scale = 0.0f;
  expect(zero_scale, slots, v, {"v_scale 0", "positive and finite"});
  ref::Buffer ints(DType::int32, m.k_cache.size());
  KvCache int_cache = kv;
  int_cache.k = ref::view(ints, 0, {4, 16, 2, 64});
  expect(int_cache, slots, v, {"k_cache has dtype int32"});
  KvCache pages = kv;
  pages.v = ref::view(m.v_cache, 0, {2, 32, 2, 64});
  expect(pages, slots, v, {"v_cache", "pages and page_size must match"});
  KvSlots both = slots;
  both.cache_offsets = ref::view(m.slots, 0, {1});
  expect(kv, both, v, {"exactly one of slot_mapping", "cache_offsets"});
  expect(kv, KvSlots{}, v, {"exactly one of slot_mapping"});
  expect(kv, KvSlots::contiguous(ref::view(m.slots, 0, {12})), v, {"needs cu_seqlens"});
  KvCache hnd = kv;
  hnd.layout = KvCacheLayout::hnd;
  hnd.k = ref::view(m.k_cache, 0, {4, 2, 16, 64});
  hnd.v = ref::view(m.v_cache, 0, {4, 2, 16, 64});
  expect(hnd, KvSlots::contiguous(ref::view(m.slots, 0, {2}), ref::view(m.slots, 0, {3})), v,
         {"cache_offsets needs a contiguous cache"});
  // Enum values outside their enumerators (a C++ enum of uint8_t holds any byte): the layout
  // was read as HND and the rotation's as interleaved.
  KvCache no_layout = kv;
  no_layout.layout = static_cast<KvCacheLayout>(5);
  expect(no_layout, slots, v, {"apply_rope_append_kv", "kv_layout 5", "KvCacheLayout"});
  RopeOptions bad_rotation;
  bad_rotation.layout = static_cast<RopeLayout>(7);
  expect_error([&] { embrope::apply_rope_append_kv(q, k, v, pos, cache, kv, slots, bad_rotation); },
               {ErrorCode::invalid_argument}, {"apply_rope_append_kv", "layout 7", "RopeLayout"});
  expect(kv, KvSlots::paged(ref::view(m.slots, 0, {11})), v, {"slot_mapping", "token dimensions"});
  expect(kv, slots, ref::view(m.v, 0, {12, 1, 64}), {"v", "kv_heads of k"});
  ref::Buffer v16(DType::float16, m.v.size());
  expect(kv, slots, ref::view(v16, 0, {12, 2, 64}), {"v has dtype float16"});
  // The cache may not overlap an input or output.
  ref::Buffer big(DType::float32, 4 * 16 * 2 * 64);
  KvCache over = kv;
  over.v = ref::view(big, 0, {4, 16, 2, 64});
  expect_error(
      [&] {
        embrope::apply_rope_append_kv(ref::view(big, 64, {12, 4, 64}), k, v, pos, cache, over,
                                      slots);
      },
      {ErrorCode::invalid_argument}, {"v_cache", "overlaps", "q"});
  KvCache kv_same = kv;
  kv_same.v = kv_same.k;
  expect(kv_same, slots, v, {"v_cache", "k_cache"});
  // A float8 q_out's arguments: its head scales float32 [Hq] and apart from the cache, q_nope's
  // output apart from the cache and v, k's float8 forms refused; nothing written.
  {
    ref::Buffer q8(DType::float8_e4m3fn, m.q.size()), nope8(DType::float8_e4m3fn, 12 * 4 * 8);
    ref::Buffer half_scales(DType::float16, 4);
    const auto cache_before = m.k_cache.snapshot();
    const auto with = [&](const std::function<void(RopeOptions&)>& set,
                          std::initializer_list<const char*> parts) {
      RopeOptions o;
      o.q_out = ref::view(q8, 0, {12, 4, 64});
      set(o);
      expect_error([&] { embrope::apply_rope_append_kv(q, k, v, pos, cache, kv, slots, o); },
                   {ErrorCode::invalid_argument}, parts);
      CHECK(m.k_cache.snapshot() == cache_before);
    };
    with([&](RopeOptions& o) { o.q_out_head_scales = ref::view(half_scales, 0, {4}); },
         {"q_out_head_scales has dtype float16", "float32"});
    with([&](RopeOptions& o) { o.q_out_head_scales = ref::view(m.k_cache, 0, {4}); },
         {"k_cache", "overlaps", "q_out_head_scales"});
    with([&](RopeOptions& o) { o.q_out_head_scales = ref::view(m.k_cache, 0, {3}); },
         {"q_out_head_scales", "the heads of the output"});
    with(
        [&](RopeOptions& o) {
          o.q_nope = ref::view(m.q, 0, {12, 4, 8});
          o.q_nope_out = ref::view(m.v_cache, 0, {12, 4, 8});  // the cache's bytes, wrong dtype
        },
        {"q_nope_out"});
    with(
        [&](RopeOptions& o) {
          o.q_nope = ref::view(m.q, 0, {12, 4, 8});
          o.q_nope_out = Tensor(static_cast<unsigned char*>(q8.data()) + 64, DType::float8_e4m3fn,
                                {12, 4, 8});  // over q_out's bytes
        },
        {"q_nope_out", "overlaps"});
    with(
        [&](RopeOptions& o) {
          o.k_nope = ref::view(m.k, 0, {12, 2, 8});
          o.k_nope_out = ref::view(nope8, 0, {12, 2, 8});
        },
        {"k_nope is given", "k_scale"});
    with([&](RopeOptions& o) { o.k_out_head_scales = ref::view(half_scales, 0, {2}); },
         {"k_out_head_scales is set", "k_scale"});
  }
  expect_error(
      [&] {
        KvCache::combined(ref::view(m.k_cache, 0, {4, 3, 16, 2, 8}));
      },
      {ErrorCode::invalid_argument}, {"kv_cache", "2 (k, then v)"});
}

// ---------------------------------------------------------- apply_qk_norm_rope_append_kv ----

TEST_CASE("apply_qk_norm_rope_append_kv: layouts, dtypes, caches, norms (Qwen3 serving)",
          "[apply_qk_norm_rope_append_kv]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (KvCacheLayout layout : {KvCacheLayout::nhd, KvCacheLayout::hnd}) {
      KvCase c;  // Qwen3's shape in small: head_dim 128, GQA 4:2
      c.norm = true;
      c.dtype = c.cache_dtype = dtype;
      c.head_dim = c.rotary_dim = c.v_dim = 128;
      c.layout = layout;
      c.seq = 20;
      c.pages = 3;
      c.norm_dtype = layout == KvCacheLayout::nhd ? DType::float32 : dtype;
      c.seed = static_cast<std::uint64_t>(40 + static_cast<int>(dtype));
      check_case(c);
    }
    for (DType cache : {DType::float8_e4m3fn, DType::float8_e5m2}) {
      KvCase c;  // float8 caches with scales
      c.norm = true;
      c.dtype = dtype;
      c.cache_dtype = cache;
      c.k_scale = 0.0125f;
      c.v_scale = 0.75f;
      c.interleaved = cache == DType::float8_e5m2;
      check_case(c);
    }
  }
  KvCase gemma;  // Gemma 3: 1 + w, bfloat16 weights, k_out and q_out, combined cache
  gemma.norm = true;
  gemma.unit_offset = true;
  gemma.dtype = gemma.cache_dtype = gemma.norm_dtype = DType::bfloat16;
  gemma.q_out = gemma.k_out = true;
  gemma.combined = true;
  check_case(gemma);
  KvCase partial;  // partial rotary: the norm covers the whole head, odd sizes, MQA
  partial.norm = true;
  partial.head_dim = partial.v_dim = 80;
  partial.rotary_dim = 20;
  partial.hq = 3;
  partial.hk = 1;
  partial.v_dim = 7;
  partial.eps = 1e-2;
  partial.cache_dtype = DType::float16;
  check_case(partial);
  KvCase unweighted;  // no weights (1), [B, S] inputs, int32 indices
  unweighted.norm = true;
  unweighted.norm_weights = false;
  unweighted.batch = 3;
  unweighted.seq = 5;
  unweighted.index_dtype = DType::int32;
  check_case(unweighted);
  KvCase contiguous;  // contiguous caches from packed inputs
  contiguous.norm = true;
  contiguous.slots = SlotKind::packed_offsets;
  contiguous.seq = 11;
  contiguous.cu = {0, 4, 4, 11};
  contiguous.offsets = {2, 9, 5};
  contiguous.pages = 3;
  contiguous.page_size = 16;
  contiguous.dtype = contiguous.cache_dtype = DType::bfloat16;
  check_case(contiguous);
  for (DType q8 : {DType::float8_e4m3fn, DType::float8_e5m2}) {
    for (DType dtype : {DType::float32, DType::bfloat16}) {
      KvCase c;  // a float8 q_out: normalised and rotated in float32, rounded once
      c.norm = true;
      c.dtype = c.cache_dtype = dtype;
      c.head_dim = c.rotary_dim = c.v_dim = 128;
      c.q_out = true;
      c.q_float8 = q8;
      c.q_head_scales = q8 == DType::float8_e4m3fn;
      c.unit_offset = dtype == DType::bfloat16;
      c.seed = static_cast<std::uint64_t>(70 + static_cast<int>(dtype));
      check_case(c);
    }
  }
  KvCase norm_q8_partial;  // partial rotary, float8 cache and q_out
  norm_q8_partial.norm = true;
  norm_q8_partial.head_dim = norm_q8_partial.v_dim = 80;
  norm_q8_partial.rotary_dim = 20;
  norm_q8_partial.cache_dtype = DType::float8_e4m3fn;
  norm_q8_partial.q_out = true;
  norm_q8_partial.q_float8 = DType::float8_e4m3fn;
  norm_q8_partial.dtype = DType::float16;
  norm_q8_partial.interleaved = true;
  check_case(norm_q8_partial);
  KvCase decode;  // one token per sequence, [B, 1] inputs
  decode.norm = true;
  decode.slots = SlotKind::batched_offsets;
  decode.batch = 3;
  decode.seq = 1;
  decode.pages = 4;
  decode.offsets = {15, 3, 0};
  check_case(decode);
}

TEST_CASE("apply_qk_norm_rope_append_kv bad slots and positions, argument errors",
          "[apply_qk_norm_rope_append_kv][errors]") {
  KvCase c;
  c.norm = true;
  c.seq = 6;
  c.pages = 2;
  c.page_size = 4;
  c.slot_values = {0, 1, 9, -1, 2, 3};
  KvMemory m = make_memory(c);
  KvMemory before = m;
  const RopeCache cache({c.rotary_dim, 10000.0, c.max_positions});
  m.positions.set_index(4, c.max_positions);  // token 4: a bad position, slot 2 not written
  DeferredStatus status;
  run_fused(c, m, cache, &status);
  try {
    status.check();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(ref::mentions(e.what(), "apply_qk_norm_rope_append_kv"));
    CHECK(ref::mentions(e.what(), "slot_mapping[2] = 9"));  // the first bad token
  }
  for (std::int64_t slot = 0; slot < 8; ++slot) {
    const bool written = slot == 0 || slot == 1 || slot == 3;  // tokens 0, 1, 5
    const std::int64_t i = cache_index(c, 0, slot / 4, slot % 4, 0, 0);
    CHECK((m.k_cache.bits(i) != before.k_cache.bits(i)) == written);
    const std::int64_t vi = cache_index(c, 1, slot / 4, slot % 4, 0, 0);
    CHECK((m.v_cache.bits(vi) != before.v_cache.bits(vi)) == written);
  }
  for (std::int64_t e = 0; e < c.hq * c.head_dim; ++e) CHECK(m.q.get(4 * c.hq * 64 + e) == 0.0);
  CHECK(m.q.bits(2 * c.hq * 64) != before.q.bits(2 * c.hq * 64));  // a bad slot: q normalised

  // The norm's rules, named for this op; weights may not overlap an output or the cache.
  KvCase a;
  a.norm = true;
  KvMemory am = make_memory(a);
  const Tensor q = ref::view(am.q, 0, {12, 4, 64});
  const Tensor k = ref::view(am.k, 0, {12, 2, 64});
  const Tensor v = ref::view(am.v, 0, {12, 2, 64});
  const Tensor pos = ref::view(am.positions, 0, {12});
  const KvSlots slots = KvSlots::paged(ref::view(am.slots, 0, {12}));
  const KvCache kv = cache_views(a, am);
  auto expect = [&](const embrope::QkNorm& n, std::initializer_list<const char*> parts,
                    const KvCache& kvc) {
    expect_error([&] { embrope::apply_qk_norm_rope_append_kv(q, k, v, pos, cache, kvc, slots, n); },
                 {ErrorCode::invalid_argument}, parts);
  };
  embrope::QkNorm n = qk_norm(a, am);
  n.eps = -1.0f;
  expect(n, {"apply_qk_norm_rope_append_kv", "eps -1", "finite and >= 0"}, kv);
  n = qk_norm(a, am);
  n.q_weight = ref::view(am.q_weight, 0, {32});
  expect(n, {"apply_qk_norm_rope_append_kv", "q_weight", "head_dim of q"}, kv);
  n = qk_norm(a, am);
  n.k_weight.reset();
  n.unit_offset = true;
  expect(n, {"unit_offset", "k_weight is absent"}, kv);
  n = qk_norm(a, am);
  n.k_weight = ref::view(am.k_cache, 0, {64});  // the cache would overwrite the weight
  expect(n, {"k_cache", "overlaps", "k_weight"}, kv);
  n = qk_norm(a, am);
  n.q_weight = ref::view(am.q, 64, {64});  // q (written in place) would overwrite it
  expect(n, {"q", "overlaps", "q_weight"}, kv);
  // Float8: q_out alone (k's float8 form is the cache's), no q_nope (the norm covers whole
  // rows); nothing written.
  ref::Buffer q8(DType::float8_e4m3fn, am.q.size()), k8(DType::float8_e4m3fn, am.k.size());
  const auto cache_before = am.k_cache.snapshot();
  const auto expect_options = [&](const RopeOptions& o, std::initializer_list<const char*> words) {
    expect_error(
        [&] {
          embrope::apply_qk_norm_rope_append_kv(q, k, v, pos, cache, kv, slots, qk_norm(a, am), o);
        },
        {ErrorCode::invalid_argument}, words);
    CHECK(am.k_cache.snapshot() == cache_before);
  };
  RopeOptions o;
  o.q_out = ref::view(q8, 0, {12, 4, 64});
  o.k_out = ref::view(k8, 0, {12, 2, 64});
  expect_options(
      o, {"apply_qk_norm_rope_append_kv", "k_out has dtype float8_e4m3fn", "the cache", "k_scale"});
  o.k_out.reset();
  o.k_out_scale = 2.0f;
  expect_options(o, {"k_out_scale is set", "k_scale"});
  o.k_out_scale = 1.0f;
  o.q_out_scale = -1.0f;
  expect_options(o, {"q_out_scale -1", "positive and finite"});
  o.q_out_scale = 1.0f;
  o.q_nope = ref::view(am.q, 0, {12, 4, 8});
  o.q_nope_out = ref::view(q8, 0, {12, 4, 8});
  expect_options(o, {"q_nope is given", "whole head rows"});
}
