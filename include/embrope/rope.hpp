// apply_rope: rotary position embedding of queries and keys (DESIGN.md 3.3).
#pragma once

#include "embrope/detail/export.hpp"

#include <array>
#include <cstdint>
#include <optional>

#include "embrope/rope_cache.hpp"
#include "embrope/status.hpp"
#include "embrope/tensor.hpp"

namespace embrope {

// Which elements form a rotation pair within the first rotary_dim elements of a head.
enum class RopeLayout : std::uint8_t {
  neox,         // (x[i], x[i + R/2]): GPT-NeoX, HF Llama rotate_half
  interleaved,  // (x[2i], x[2i + 1]): GPT-J, RoFormer, Meta's complex form
};

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
  // Multimodal RoPE (Qwen2-VL mrope_section, DESIGN.md 3.4): all zero = off. Otherwise three
  // non-negative section sizes summing to rotary_dim / 2; positions then carry three streams,
  // [3, T] or [3, B, S] (temporal, height, width), and frequency i takes its angle from stream
  // j of the section j that holds i (HF apply_multimodal_rotary_pos_emb, both halves alike).
  std::array<std::int64_t, 3> mrope_section{};
  // Null: a bad position makes the call throw. Otherwise it is recorded there (status.hpp).
  DeferredStatus* deferred = nullptr;
  Stream stream{};
};

// Rotates q [T, Hq, D] or [B, S, Hq, D] and, when given, k [T, Hk, D] or [B, S, Hk, D]
// (Hk may differ from Hq: GQA/MQA) by the angles of `positions` [T] or [B, S] (int32 or
// int64; [3, T] or [3, B, S] with mrope_section). q and k are float32, float16 or bfloat16 (the
// same dtype); every dimension but the last may have any non-negative stride; the last has
// stride 1. Arithmetic is float32 with one rounding to the output dtype. A position outside [0,
// table rows) zero-fills its token's output rows and is reported (status.hpp).
EMBROPE_EXPORT void apply_rope(const Tensor& q, const std::optional<Tensor>& k,
                               const Tensor& positions, const RopeCache& cache,
                               const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin are [max_positions, rotary_dim / 2]
// (vLLM / ONNX style), any value dtype (both the same), last stride 1. Used as given: any
// attention factor must already be folded in.
EMBROPE_EXPORT void apply_rope(const Tensor& q, const std::optional<Tensor>& k,
                               const Tensor& positions, const Tensor& cos, const Tensor& sin,
                               const RopeOptions& options = {});

}  // namespace embrope
