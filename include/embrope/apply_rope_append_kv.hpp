// apply_rope_append_kv: RoPE of q and k fused with the write of k and v into a KV cache
// (docs/ops.md, "apply_rope_append_kv"), in one launch on a GPU and one pass on the CPU; and
// apply_qk_norm_rope_append_kv, the same with the per-head RMSNorm of apply_qk_norm_rope first.
#pragma once

#include <optional>

#include "embrope/apply_qk_norm_rope.hpp"
#include "embrope/apply_rope.hpp"
#include "embrope/export.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/tensor.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// The KV cache a call writes: k and v tensors of the same layout, pages and page size, any
// strides with the last one 1.
//   paged NHD:  [pages, page_size, Hk, D]  (vLLM, FlashInfer)
//   paged HND:  [pages, Hk, page_size, D]  (TensorRT-LLM's KV blocks)
//   contiguous: [B, max_len, Hk, D], which is NHD with one page of max_len slots per sequence
// v's head dim may differ from k's (MLA-style). The cache dtype is the activations' dtype,
// any other of float32 / float16 / bfloat16, or float8_e4m3fn / float8_e5m2, which store
// value / scale rounded to nearest even and saturated to the finite range (NaN stays NaN).
struct KvCache {
  Tensor k, v;
  KvCacheLayout layout = KvCacheLayout::nhd;
  // Per-tensor scales of float8 caches (k_cache = k / k_scale); 1 for other dtypes.
  float k_scale = 1.0f, v_scale = 1.0f;

  // One tensor holding both, [pages, 2, page_size, Hk, D] (NHD) or [pages, 2, Hk, page_size,
  // D] (HND): k at index 0 of dimension 1, v at index 1 (FlashInfer's and vLLM's combined
  // paged_kv_cache).
  EMBROPE_EXPORT static KvCache combined(const Tensor& kv,
                                         KvCacheLayout layout = KvCacheLayout::nhd,
                                         float k_scale = 1.0f, float v_scale = 1.0f);
};

// Where each token's k and v rows go: exactly one of slot_mapping and cache_offsets.
struct KvSlots {
  // Paged: [T] or [B, S] like positions, int32/int64; slot = page * page_size + offset (vLLM's
  // slot_mapping); -1 skips the token (padding).
  std::optional<Tensor> slot_mapping;
  // Contiguous ([B, max_len, Hk, D] caches): [B] int32/int64, where sequence b's first token
  // of this call goes; token s of sequence b goes to row cache_offsets[b] + s of page b.
  std::optional<Tensor> cache_offsets;
  // With cache_offsets and packed [T, H, D] inputs: [B + 1], sequence b holds tokens
  // [cu_seqlens[b], cu_seqlens[b + 1]) (packed_positions' convention; a token goes to the
  // last sequence starting at or before it). Absent: inputs are [B, S, H, D].
  std::optional<Tensor> cu_seqlens;

  static KvSlots paged(const Tensor& slot_mapping) { return {slot_mapping, {}, {}}; }
  static KvSlots contiguous(const Tensor& cache_offsets,
                            const std::optional<Tensor>& cu_seqlens = {}) {
    return {{}, cache_offsets, cu_seqlens};
  }
};

// Rotates q [T, Hq, D] or [B, S, Hq, D] and k [T, Hk, D] or [B, S, Hk, D] by `positions` exactly
// as apply_rope does (every RopeOptions field: layout, inverse, rotary_dim, mrope_section,
// deferred, stream), and writes the rotated k and v [T, Hk, Dv] or [B, S, Hk, Dv] (v's dtype
// is q's) into the cache at each token's slot.
//
// - q is rotated in place, or into options.q_out: q's dtype, or float8_e4m3fn / float8_e5m2
//   (FlashInfer's rope_quantize_fp8_append_paged_kv_cache): every element of q stored as
//   float8(value * scale), rotated in float32 and rounded once, with options.q_out_scale and
//   q_out_head_scales, and q's non-rotary part held apart in options.q_nope / q_nope_out if
//   given (DeepSeek MLA's q_nope), all as apply_rope does it.
// - k is only read, unless options.k_out is given: rotated k is then written there too (k_out
//   may be k itself, for in place), in k's dtype. A float8 k is the cache's (k_scale): k_out,
//   k_out_scale, k_out_head_scales and k_nope are refused in float8.
// - The cache receives rotated k as apply_rope would have written it (rounded to the
//   activations' dtype) then converted to the cache dtype, so the call gives the same bytes as
//   apply_rope followed by a copy into the cache.
// - A slot of -1 skips its token's cache rows. A slot outside the cache (or, with
//   cache_offsets, a write position outside [0, max_len)) is a bad index, and so is a position
//   outside the table: the token's cache rows are not written (a bad position also
//   zero-fills its q and k_out rows, as in apply_rope), other tokens are, and the first bad
//   token is reported (deferred_status.hpp). A skipped or bad slot leaves q and k_out rotated.
EMBROPE_EXPORT void apply_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& positions, const RopeCache& cache,
                                         const KvCache& kv_cache, const KvSlots& slots,
                                         const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin [max_positions, rotary_dim / 2].
EMBROPE_EXPORT void apply_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& positions, const Tensor& cos,
                                         const Tensor& sin, const KvCache& kv_cache,
                                         const KvSlots& slots, const RopeOptions& options = {});

// ------------------------------------------------------- apply_qk_norm_rope_append_kv ----

// Qwen3-style serving in one pass: every head row of q and k is normalised and rotated exactly
// as apply_qk_norm_rope does it (QkNorm: q_weight / k_weight, eps, unit_offset; every
// RopeOptions field but q_nope / k_nope: the norm covers whole rows), then the normalised,
// rotated k and the v rows are written into the cache exactly as apply_rope_append_kv writes
// them (every KvCache layout and dtype, paged or contiguous slots, -1 skips, bad slots and
// positions reported the same way).
// - q is written in place or into options.q_out: q's dtype, or float8 as in
//   apply_rope_append_kv (each element normalised and rotated in float32, then scaled by
//   q_out_scale and its head's scale and rounded once).
// - k is only read unless options.k_out is given; the cache gets the bytes
//   apply_qk_norm_rope followed by a copy (converted to the cache dtype) would give.
// - v is copied, not normalised.
EMBROPE_EXPORT void apply_qk_norm_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& positions, const RopeCache& cache,
                                                 const KvCache& kv_cache, const KvSlots& slots,
                                                 const QkNorm& norm,
                                                 const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin [max_positions, rotary_dim / 2].
EMBROPE_EXPORT void apply_qk_norm_rope_append_kv(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& positions, const Tensor& cos,
                                                 const Tensor& sin, const KvCache& kv_cache,
                                                 const KvSlots& slots, const QkNorm& norm,
                                                 const RopeOptions& options = {});

EMBROPE_END_NAMESPACE
