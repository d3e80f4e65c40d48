// apply_rope: rotary position embedding of queries and keys (docs/ops.md, "apply_rope"),
// and apply_rope_backward, its gradient (docs/ops.md, "apply_rope_backward").
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "embrope/deferred_status.hpp"
#include "embrope/export.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/tensor.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

struct RopeOptions {
  RopeLayout layout = RopeLayout::neox;
  // Rotate by -angle (cos, -sin): the transpose of the forward map, so the backward pass of
  // RoPE. With an attention factor m folded into the table (yarn, longrope) the forward is
  // m R(angle) and this gives m R(-angle): the gradient, and the inverse only when m is 1.
  bool inverse = false;
  // 0: take it from the cos/sin table. Otherwise it must equal the table's rotary dim
  // (a cheap guard against pairing a model with the wrong cache).
  std::int64_t rotary_dim = 0;
  // Outputs for out-of-place rotation, shaped like q and k (any strides, last stride 1).
  // Absent: q (k) is rotated in place. Elements at and past rotary_dim are copied.
  std::optional<Tensor> q_out;
  std::optional<Tensor> k_out;
  // Multimodal RoPE (Qwen2-VL mrope_section, docs/ops.md): all zero = off. Otherwise three
  // non-negative section sizes summing to rotary_dim / 2; positions then carry three streams,
  // [3, T] or [3, B, S] (temporal, height, width), and frequency i takes its angle from stream
  // j of the section j that holds i (HF apply_multimodal_rotary_pos_emb, both halves alike).
  std::array<std::int64_t, 3> mrope_section{};
  // With mrope_section: the streams interleaved over the frequencies as Qwen3-VL does them
  // (mrope_interleaved in its config; detail::mrope_stream) instead of in contiguous sections.
  bool mrope_interleaved = false;
  // Axial RoPE (vision encoders, diffusion transformers; docs/ops.md, "Axial RoPE"): all zero
  // = off. Otherwise N = 1 to 4 leading positive even sizes, then zeros, summing to rotary_dim:
  // axis a owns the next axes_dim[a] rotary features (axes_dim[a] / 2 pairs, diffusers'
  // FluxPosEmbed axes_dim, Flux.1's {16, 56, 56}); positions carry one stream per axis, [N, T]
  // or [N, B, S] (the token's coordinate on each axis, Flux's ids transposed), and pair i takes
  // its angle from the axis that owns it. With a RopeCache built by RopeCache::axial this may
  // stay zero (the cache's axes are used) or must equal them; a cos/sin table must come with
  // it. Not together with mrope_section.
  std::array<std::int64_t, 4> axes_dim{};
  // Null: a bad position makes the call throw. Otherwise it is recorded there
  // (deferred_status.hpp).
  DeferredStatus* deferred = nullptr;
  Stream stream{};
  // Float8 outputs (apply_rope, and the q_out of the KV appends, apply_rope_append_kv.hpp;
  // docs/ops.md, "Float8 outputs"): q_out of dtype
  // float8_e4m3fn or float8_e5m2, and k_out of the same dtype when k is given. Every element,
  // rotated or passed through, is stored as float8(value * scale), computed in float32 and
  // rounded once to nearest even, saturated to the finite range (NaN stays NaN): the scale
  // multiplies, as FlashInfer's rope_quantize_fp8 quant_scale_q / quant_scale_kv do. q's
  // scale is q_out_scale, times q_out_head_scales[h] for head h when given (float32 [Hq],
  // last stride 1, on q's device, used as given); k's alike. Other outputs take scale 1 and no
  // head scales.
  float q_out_scale = 1.0f;
  float k_out_scale = 1.0f;
  std::optional<Tensor> q_out_head_scales;
  std::optional<Tensor> k_out_head_scales;
  // With float8 outputs only: the non-rotary parts of q and k held in tensors of their own
  // (FlashInfer's rope_quantize_fp8 q_nope / k_nope; DeepSeek MLA's q_nope and kv_c), quantized
  // in the same pass with q's (k's) scales, head for head. q_nope [T, Hq, Dn] or [B, S, Hq, Dn]
  // (q's dtype, token dims and heads, its own last dim) into q_nope_out (its shape, the float8
  // dtype of q_out); k_nope [T, Hk, Dkn] into k_nope_out likewise (needs k). Both of a pair or
  // neither.
  std::optional<Tensor> q_nope, q_nope_out;
  std::optional<Tensor> k_nope, k_nope_out;
};

// Rotates q [T, Hq, D] or [B, S, Hq, D] and, when given, k [T, Hk, D] or [B, S, Hk, D]
// (Hk may differ from Hq: GQA/MQA) by the angles of `positions` [T] or [B, S] (int32 or
// int64; [3, T] or [3, B, S] with mrope_section; [N, T] or [N, B, S] with N axes). q and k are
// float32, float16 or bfloat16 (the same dtype); every dimension but the last may have any
// non-negative stride; the last has stride 1. Arithmetic is float32 with one rounding to the output
// dtype. A position outside [0, table rows) zero-fills its token's output rows and is reported
// (deferred_status.hpp).
EMBROPE_EXPORT void apply_rope(const Tensor& q, const std::optional<Tensor>& k,
                               const Tensor& positions, const RopeCache& cache,
                               const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin are [max_positions, rotary_dim / 2]
// (vLLM / ONNX style), any value dtype (both the same), last stride 1. Used as given: any
// attention factor must already be folded in.
EMBROPE_EXPORT void apply_rope(const Tensor& q, const std::optional<Tensor>& k,
                               const Tensor& positions, const Tensor& cos, const Tensor& sin,
                               const RopeOptions& options = {});

// ------------------------------------------------------------- apply_rope_backward ----

// RoPE is a linear map per token and pair, y = m R(theta) x, with R a rotation and m the
// attention factor folded into the cos/sin table. Its gradient is the transpose,
// dx = m R(theta)^T dy = m R(-theta) dy: the same rotation with -sin, which is what this
// computes, in one launch for dq and dk, in place by default.
//
// dq and dk (optional) are the gradients of the forward's outputs, shaped like its q and k;
// positions, the table (cache, or cos and sin) and options are those of the forward call.
// options.inverse names the forward's direction: a forward with inverse = true rotated by
// -theta, so its gradient rotates by +theta. options.q_out / k_out, when given, receive the
// gradients out of place (elements at and past rotary_dim are copied: their gradient passes
// through); absent, dq and dk are overwritten. Positions outside the table zero-fill their
// token's rows and are reported as apply_rope's are (deferred_status.hpp). Errors, argument
// errors and bad positions alike, name apply_rope_backward, dq and dk.
EMBROPE_EXPORT void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                        const Tensor& positions, const RopeCache& cache,
                                        const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin [max_positions, rotary_dim / 2], as in
// apply_rope.
EMBROPE_EXPORT void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                        const Tensor& positions, const Tensor& cos,
                                        const Tensor& sin, const RopeOptions& options = {});

EMBROPE_END_NAMESPACE
