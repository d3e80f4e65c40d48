// apply_rope_append_kv and apply_qk_norm_rope_append_kv: validate once and fill
// RopeAppendKvParams, then run the CPU or CUDA kernel. The rotation's arguments are
// apply_rope's, checked by its prepare_rope; the norm's are apply_qk_norm_rope's
// (prepare_qk_norm). Errors name the op called.
#include "embrope/apply_rope_append_kv.hpp"
#include "embrope/version.hpp"

#include "apply_rope.hpp"
#include "backend.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

using internal::CosSinTable;
using validate::fail;

// A KV-cache view's dims by meaning: page, slot offset, head, element.
struct CacheDims {
  int page = 0, offset = 1, head = 2;
};
CacheDims cache_dims(KvCacheLayout layout) {
  return layout == KvCacheLayout::nhd ? CacheDims{0, 1, 2} : CacheDims{0, 2, 1};
}

const char* layout_name(KvCacheLayout layout) {
  return layout == KvCacheLayout::nhd ? "NHD [pages, page_size, kv_heads, head_dim]"
                                      : "HND [pages, kv_heads, page_size, head_dim]";
}

void check_cache(const char* op, const char* name, const Tensor& c, Device device, float scale,
                 const char* scale_name) {
  validate::check_view(op, name, c, 4, 4);
  validate::check_same_device(op, name, c, "q", device);
  validate::check_last_contiguous(op, name, c);
  if (!is_value_dtype(c.dtype()) && !is_float8_dtype(c.dtype())) {
    fail(op,
         "{} has dtype {}; a cache is float32, float16, bfloat16, float8_e4m3fn or "
         "float8_e5m2",
         name, dtype_name(c.dtype()));
  }
  if (!(scale > 0.0f) || scale == INFINITY) {
    fail(op, "{} {} must be positive and finite", scale_name, scale);
  }
  if (!is_float8_dtype(c.dtype()) && scale != 1.0f) {
    fail(op, "{} {} applies to float8 caches only; {} is {} (pass 1)", scale_name, scale, name,
         dtype_name(c.dtype()));
  }
}

internal::KvCacheSide cache_side(const Tensor& c, KvCacheLayout layout, float scale) {
  const CacheDims d = cache_dims(layout);
  internal::KvCacheSide side;
  side.data = c.data();
  side.dtype = c.dtype();
  side.stride_page = c.stride(d.page);
  side.stride_offset = c.stride(d.offset);
  side.stride_head = c.stride(d.head);
  side.head_dim = c.shape(3);
  side.scale = scale;
  return side;
}

void check_slot_tensor(const char* op, const char* name, const Tensor& t, int ndim, Device device) {
  validate::check_view(op, name, t, ndim, ndim);
  validate::check_index_dtype(op, name, t);
  validate::check_same_device(op, name, t, "q", device);
}

// norm: null for apply_rope_append_kv.
void apply(const internal::RopeNames& names, const Tensor& q, const Tensor& k, const Tensor& v,
           const Tensor& positions, const CosSinTable& table, const KvCache& kv,
           const KvSlots& slots, const QkNorm* norm, const RopeOptions& options) {
  const char* op = names.op;
  // The rotation: apply_rope's rules for q, k, positions, the table and the options. Without
  // k_out, k is only read (the names' k_in_place is false).
  if (norm != nullptr && (options.q_nope || options.q_nope_out)) {
    fail(op,
         "{} is given, but the norm is over whole head rows: give q whole (rotary_dim, then the "
         "rest of the row, quantized with it into a float8 q_out)",
         options.q_nope ? "q_nope" : "q_nope_out");
  }
  internal::RopeAppendKvParams p;
  p.rope = internal::prepare_rope(names, q, k, positions, table, options);
  if (norm != nullptr) {
    p.qk_norm = true;
    p.norm = internal::prepare_qk_norm(op, q, k, *norm);
  }
  p.write_k_out = options.k_out.has_value();
  const Device device = q.device();
  const int n = q.ndim();
  const std::int64_t kv_heads = k.shape(n - 2);

  // v: k's token and head dimensions, its own head dim, q's dtype.
  validate::check_view(op, "v", v, n, n);
  validate::check_same_device(op, "v", v, "q", device);
  validate::check_same_dtype(op, "v", v, "q", q.dtype());
  validate::check_last_contiguous(op, "v", v);
  for (int d = 0; d < n - 1; ++d) {
    validate::check_dim(op, "v", v, d, k.shape(d), d == n - 2 ? "kv_heads of k" : "those of k");
  }
  p.v = v.data();
  p.v_stride_b = n == 4 ? v.stride(0) : 0;
  p.v_stride_s = v.stride(n - 3);
  p.v_stride_h = v.stride(n - 2);

  // The caches.
  if (kv.layout != KvCacheLayout::nhd && kv.layout != KvCacheLayout::hnd) {
    fail(op, "kv_layout {} is not a KvCacheLayout (nhd or hnd)", static_cast<int>(kv.layout));
  }
  check_cache(op, "k_cache", kv.k, device, kv.k_scale, "k_scale");
  check_cache(op, "v_cache", kv.v, device, kv.v_scale, "v_scale");
  const CacheDims d = cache_dims(kv.layout);
  for (int dim : {d.page, d.offset}) {
    if (kv.v.shape(dim) != kv.k.shape(dim)) {
      fail(op, "v_cache has shape {} but k_cache has {}; pages and page_size must match ({})",
           validate::shape_string(kv.v), validate::shape_string(kv.k), layout_name(kv.layout));
    }
  }
  validate::check_dim(op, "k_cache", kv.k, d.head, kv_heads, "kv_heads of k");
  validate::check_dim(op, "v_cache", kv.v, d.head, kv_heads, "kv_heads of k");
  validate::check_dim(op, "k_cache", kv.k, 3, k.shape(n - 1), "head_dim of k");
  validate::check_dim(op, "v_cache", kv.v, 3, v.shape(n - 1), "head_dim of v");
  p.k_cache = cache_side(kv.k, kv.layout, kv.k_scale);
  p.v_cache = cache_side(kv.v, kv.layout, kv.v_scale);
  p.pages = kv.k.shape(d.page);
  p.page_size = kv.k.shape(d.offset);

  // The slots.
  const bool batched = n == 4;
  if (slots.slot_mapping.has_value() == slots.cache_offsets.has_value()) {
    fail(op,
         "slots must give exactly one of slot_mapping (a paged cache) and cache_offsets "
         "(a contiguous cache)");
  }
  const Tensor* slot_inputs[3] = {nullptr, nullptr, nullptr};
  const char* slot_names[3] = {"slot_mapping", "cache_offsets", "cu_seqlens"};
  if (slots.slot_mapping) {
    const Tensor& s = *slots.slot_mapping;
    if (slots.cu_seqlens) fail(op, "cu_seqlens goes with cache_offsets, not slot_mapping");
    check_slot_tensor(op, "slot_mapping", s, n - 2, device);
    for (int dim = 0; dim < n - 2; ++dim) {
      validate::check_dim(op, "slot_mapping", s, dim, q.shape(dim), "the token dimensions of q");
    }
    p.slot_mapping = s.data();
    p.slot_dtype = s.dtype();
    p.slot_stride_b = batched ? s.stride(0) : 0;
    p.slot_stride_s = s.stride(n - 3);
    slot_inputs[0] = &s;
  } else {
    if (kv.layout != KvCacheLayout::nhd) {
      fail(op,
           "cache_offsets needs a contiguous cache [B, max_len, kv_heads, head_dim] (layout "
           "NHD); use slot_mapping for an HND cache");
    }
    const Tensor& o = *slots.cache_offsets;
    check_slot_tensor(op, "cache_offsets", o, 1, device);
    std::int64_t sequences = 0;
    if (slots.cu_seqlens) {
      if (batched) {
        fail(op, "cu_seqlens is for packed inputs [T, H, D]; q has 4 dimensions [B, S, H, D]");
      }
      const Tensor& cu = *slots.cu_seqlens;
      check_slot_tensor(op, "cu_seqlens", cu, 1, device);
      if (cu.shape(0) < 2) {
        fail(op, "cu_seqlens has shape {}; it holds B + 1 >= 2 entries",
             validate::shape_string(cu));
      }
      sequences = cu.shape(0) - 1;
      p.cu_seqlens = cu.data();
      p.cu_dtype = cu.dtype();
      p.cu_stride = cu.stride(0);
      p.sequences = sequences;
      slot_inputs[2] = &cu;
    } else {
      if (!batched) {
        fail(op,
             "cache_offsets with [T, H, D] inputs needs cu_seqlens (packed sequences); "
             "or give q as [B, S, H, D]");
      }
      sequences = q.shape(0);
    }
    validate::check_dim(op, "cache_offsets", o, 0, sequences,
                        slots.cu_seqlens ? "B = cu_seqlens entries - 1" : "the batch of q");
    if (p.pages < sequences) {
      fail(op, "k_cache has {} sequences (shape {}) but the call writes {}", p.pages,
           validate::shape_string(kv.k), sequences);
    }
    p.cache_offsets = o.data();
    p.offset_dtype = o.dtype();
    p.offset_stride = o.stride(0);
    slot_inputs[1] = &o;
  }

  // Memory: the caches share no byte with each other, with themselves, with the other
  // outputs (q_out or q, k_out) or with any input.
  validate::check_no_self_overlap(op, "k_cache", kv.k);
  validate::check_no_self_overlap(op, "v_cache", kv.v);
  validate::check_no_overlap(op, "v_cache", kv.v, "k_cache", kv.k);
  const Tensor& q_out = options.q_out ? *options.q_out : q;
  struct Named {
    const char* name;
    const Tensor* t;
  };
  const Named others[] = {
      {options.q_out ? "q_out" : "q", &q_out},
      {"q", &q},
      {"k", &k},
      {"v", &v},
      {"positions", &positions},
      {table.name, &table.cos_view},
      {"sin", &table.sin_view},
      {"k_out", options.k_out ? &*options.k_out : nullptr},
      {slot_names[0], slot_inputs[0]},
      {slot_names[1], slot_inputs[1]},
      {slot_names[2], slot_inputs[2]},
      {"q_weight", norm && norm->q_weight ? &*norm->q_weight : nullptr},
      {"k_weight", norm && norm->k_weight ? &*norm->k_weight : nullptr},
      {"q_nope", options.q_nope ? &*options.q_nope : nullptr},
      {"q_nope_out", options.q_nope_out ? &*options.q_nope_out : nullptr},
      {"q_out_head_scales", options.q_out_head_scales ? &*options.q_out_head_scales : nullptr}};
  for (const Tensor* cache : {&kv.k, &kv.v}) {
    const char* cache_name = cache == &kv.k ? "k_cache" : "v_cache";
    for (const Named& other : others) {
      if (other.t != nullptr)
        validate::check_no_overlap(op, cache_name, *cache, other.name, *other.t);
    }
  }
  // v (and the norm's weights) are read while q_out, k_out and q_nope_out are written.
  for (const Named& in : {Named{"v", &v}, others[11], others[12]}) {
    if (in.t == nullptr) continue;
    validate::check_no_overlap(op, options.q_out ? "q_out" : "q", q_out, in.name, *in.t);
    if (options.k_out) validate::check_no_overlap(op, "k_out", *options.k_out, in.name, *in.t);
    if (options.q_nope_out) {
      validate::check_no_overlap(op, "q_nope_out", *options.q_nope_out, in.name, *in.t);
    }
  }

  // Nothing to do: no tokens, or no heads at all.
  if (p.rope.batch * p.rope.seq == 0 || p.rope.q.heads + 2 * kv_heads == 0) return;
  if (p.qk_norm) {
    run_kernel(op, device, options.stream, options.deferred, p, p.rope.bad,
               cpu::apply_qk_norm_rope_append_kv, gpu::apply_qk_norm_rope_append_kv);
  } else {
    run_kernel(op, device, options.stream, options.deferred, p, p.rope.bad,
               cpu::apply_rope_append_kv, gpu::apply_rope_append_kv);
  }
}

}  // namespace

KvCache KvCache::combined(const Tensor& kv, KvCacheLayout layout, float k_scale, float v_scale) {
  const char* op = internal::kRopeAppendKvNames.op;
  validate::check_view(op, "kv_cache", kv, 5, 5);
  validate::check_dim(op, "kv_cache", kv, 1, 2, "2 (k, then v)");
  const std::int64_t shape[4] = {kv.shape(0), kv.shape(2), kv.shape(3), kv.shape(4)};
  const std::int64_t strides[4] = {kv.stride(0), kv.stride(2), kv.stride(3), kv.stride(4)};
  const std::size_t half_bytes =
      static_cast<std::size_t>(kv.stride(1)) * static_cast<std::size_t>(dtype_size(kv.dtype()));
  auto* base = static_cast<unsigned char*>(kv.data());
  KvCache cache;
  cache.k = Tensor(base, kv.dtype(), 4, shape, strides, kv.device());
  cache.v = Tensor(base == nullptr ? nullptr : base + half_bytes, kv.dtype(), 4, shape, strides,
                   kv.device());
  cache.layout = layout;
  cache.k_scale = k_scale;
  cache.v_scale = v_scale;
  return cache;
}

void apply_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& positions, const RopeCache& cache, const KvCache& kv_cache,
                          const KvSlots& slots, const RopeOptions& options) {
  apply(internal::kRopeAppendKvNames, q, k, v, positions,
        internal::cos_sin_table(internal::kRopeAppendKvNames.op, cache), kv_cache, slots, nullptr,
        options);
}

void apply_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& positions, const Tensor& cos, const Tensor& sin,
                          const KvCache& kv_cache, const KvSlots& slots,
                          const RopeOptions& options) {
  apply(internal::kRopeAppendKvNames, q, k, v, positions,
        internal::cos_sin_table(internal::kRopeAppendKvNames, cos, sin), kv_cache, slots, nullptr,
        options);
}

void apply_qk_norm_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& positions, const RopeCache& cache,
                                  const KvCache& kv_cache, const KvSlots& slots, const QkNorm& norm,
                                  const RopeOptions& options) {
  apply(internal::kQkNormRopeAppendKvNames, q, k, v, positions,
        internal::cos_sin_table(internal::kQkNormRopeAppendKvNames.op, cache), kv_cache, slots,
        &norm, options);
}

void apply_qk_norm_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& positions, const Tensor& cos, const Tensor& sin,
                                  const KvCache& kv_cache, const KvSlots& slots, const QkNorm& norm,
                                  const RopeOptions& options) {
  apply(internal::kQkNormRopeAppendKvNames, q, k, v, positions,
        internal::cos_sin_table(internal::kQkNormRopeAppendKvNames, cos, sin), kv_cache, slots,
        &norm, options);
}

EMBROPE_END_NAMESPACE
