// apply_rope's validated, flattened arguments (RopeParams), and the per-token accessors every
// RoPE-family kernel uses on both backends: rows, positions, table rows, pairs (the
// parameters of an op: produced once by src/<op>.cpp, consumed by src/cpu/<op>.cpp and
// cuda/<op>.cu; plain data and __host__ __device__ accessors only).
#pragma once

#include <cstdint>
#include <type_traits>

#include "bad_index.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "embrope/types.hpp"
#include "tensor_access.hpp"

namespace embrope::internal {

// One of q and k: [B, S, H, D] views (a [T, H, D] tensor is B = 1, S = T).
struct RopeHeads {
  const void* in = nullptr;
  void* out = nullptr;
  std::int64_t heads = 0;
  std::int64_t in_stride_b = 0, in_stride_s = 0, in_stride_h = 0;
  std::int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  // Float8 outputs (RopeParams::out_dtype): head h stores value * out_scale *
  // out_head_scales[h] (null: no head scales). 1 and null otherwise.
  float out_scale = 1.0f;
  const float* out_head_scales = nullptr;
};

struct RopeParams {
  RopeHeads q, k;
  bool has_k = false;
  DType dtype = DType::float32;  // of q and k (and of their outputs unless quantized)
  // Of the outputs: dtype, or float8_e4m3fn / float8_e5m2 (apply_rope's quantized outputs).
  DType out_dtype = DType::float32;
  std::int64_t batch = 0, seq = 0;
  std::int64_t head_dim = 0, rotary_dim = 0;
  const void* positions = nullptr;
  DType position_dtype = DType::int64;
  std::int64_t position_stride_b = 0, position_stride_s = 0;
  // Several position streams (Qwen2-VL's mrope: 3; axial RoPE: one per axis, up to 4):
  // frequency i takes its angle from stream detail::mrope_stream(i, ...) of the section sizes
  // (frequencies per stream), contiguous or interleaved (mrope only); stream j's positions are
  // at positions + j * position_stride_stream.
  bool mrope = false;
  bool mrope_interleaved = false;
  int streams = 1;
  std::int64_t mrope_section[detail::kMaxPositionStreams] = {0, 0, 0, 0};
  std::int64_t section_end[detail::kMaxPositionStreams] = {0, 0, 0, 0};  // detail::section_ends
  std::int64_t position_stride_stream = 0;
  // Row p of the table: cos at cos + p * cos_stride, sin at sin + p * sin_stride, R/2 each.
  const void* cos = nullptr;
  const void* sin = nullptr;
  DType table_dtype = DType::float32;
  std::int64_t cos_stride = 0, sin_stride = 0;
  std::int64_t table_rows = 0;
  RopeLayout layout = RopeLayout::neox;
  bool inverse = false;
  BadIndexRecord* bad = nullptr;
  // The op a bad position is reported as: apply_rope, or apply_rope_backward when the backward
  // runs these kernels.
  BadIndexOp bad_op = BadIndexOp::apply_rope;
  // Float8 outputs: the non-rotary parts of q and k in tensors of their own
  // (RopeOptions::q_nope, k_nope), quantized with q's (k's) scales; heads 0 when absent. Their
  // rows follow the rotated ones: q_nope's heads, then k_nope's (rope_nope_row).
  RopeHeads q_nope, k_nope;
  std::int64_t q_nope_dim = 0, k_nope_dim = 0;
};

// Head rows of q and k that are rotated, and the non-rotary rows after them.
EMBROPE_HD std::int64_t rope_rotated_heads(const RopeParams& p) {
  return p.q.heads + (p.has_k ? p.k.heads : 0);
}
EMBROPE_HD std::int64_t rope_nope_heads(const RopeParams& p) {
  return p.q_nope.heads + p.k_nope.heads;
}

// Head row h (counting q's heads, then k's) of token (b, s): its input row of T and output
// row of O (T, or a float8 type when the outputs are quantized).
template <typename T, typename O = T>
struct RopeRow {
  const T* in;
  O* out;
};
// Head hh of token (b, s) of one side's rows: its input and output row.
template <typename T, typename O>
EMBROPE_HD RopeRow<T, O> heads_row(const RopeHeads& x, std::int64_t b, std::int64_t s,
                                   std::int64_t hh) {
  return {static_cast<const T*>(x.in) + b * x.in_stride_b + s * x.in_stride_s + hh * x.in_stride_h,
          static_cast<O*>(x.out) + b * x.out_stride_b + s * x.out_stride_s + hh * x.out_stride_h};
}
template <typename T, typename O = T>
EMBROPE_HD RopeRow<T, O> rope_row(const RopeParams& p, std::int64_t b, std::int64_t s,
                                  std::int64_t h) {
  const bool is_q = h < p.q.heads;
  return heads_row<T, O>(is_q ? p.q : p.k, b, s, is_q ? h : h - p.q.heads);
}

// Non-rotary row n (q_nope's heads, then k_nope's) of token (b, s): in, out, its length, and
// the head whose scale it takes (rope_out_scale's numbering: q's heads, then k's).
template <typename T, typename O>
struct RopeNopeRow {
  const T* in;
  O* out;
  std::int64_t dim, head;
};
template <typename T, typename O>
EMBROPE_HD RopeNopeRow<T, O> rope_nope_row(const RopeParams& p, std::int64_t b, std::int64_t s,
                                           std::int64_t n) {
  const bool is_q = n < p.q_nope.heads;
  const std::int64_t hh = is_q ? n : n - p.q_nope.heads;
  const RopeRow<T, O> row = heads_row<T, O>(is_q ? p.q_nope : p.k_nope, b, s, hh);
  return {row.in, row.out, is_q ? p.q_nope_dim : p.k_nope_dim, is_q ? hh : p.q.heads + hh};
}

// A rotated or passed-through value x as an output element: rounded once to T, or (float8 O)
// scaled and rounded once to O, saturating (FlashInfer's rope_quantize_fp8).
template <typename T, typename O>
EMBROPE_HD O rope_output_value(float x, float scale) {
  if constexpr (std::is_same_v<O, T>) {
    return detail::from_float<T>(x);
  } else {
    return detail::from_float<O>(x * scale);
  }
}

// A float8 output element's code: x * scale rounded once to dtype (float8_e4m3fn or
// float8_e5m2), the bits of rope_output_value for a dtype known at run time.
EMBROPE_HD std::uint8_t rope_float8_code(float x, float scale, DType dtype) {
  return dtype == DType::float8_e4m3fn ? detail::float_to_float8_e4m3(x * scale)
                                       : detail::float_to_float8_e5m2(x * scale);
}

// Whether the outputs are float8 (each element stored as value * rope_out_scale).
EMBROPE_HD bool rope_quantized(const RopeParams& p) {
  return p.out_dtype != p.dtype;
}

// The float8 scale of head row h (counting q's heads, then k's): the per-tensor scale times
// the head's own, in float32.
EMBROPE_HD float rope_out_scale(const RopeParams& p, std::int64_t h) {
  const bool is_q = h < p.q.heads;
  const RopeHeads& x = is_q ? p.q : p.k;
  const std::int64_t hh = is_q ? h : h - p.q.heads;
  return x.out_head_scales == nullptr ? x.out_scale : x.out_scale * x.out_head_scales[hh];
}

// The position stream of frequency i (0 unless mrope), and the stream shared by frequencies
// [first, first + n) or -1.
EMBROPE_HD int rope_stream(const RopeParams& p, std::int64_t i) {
  return p.mrope ? detail::mrope_stream(i, p.mrope_section, p.section_end, p.mrope_interleaved) : 0;
}
EMBROPE_HD int rope_chunk_stream(const RopeParams& p, std::int64_t first, std::int64_t n) {
  return p.mrope ? detail::mrope_chunk_stream(first, n, p.mrope_section, p.section_end,
                                              p.mrope_interleaved)
                 : 0;
}

// The position of token (b, s) of a RoPE call in stream j (always 0 unless mrope).
EMBROPE_HD std::int64_t rope_position(const RopeParams& p, std::int64_t b, std::int64_t s, int j) {
  return load_index(
      p.positions, p.position_dtype,
      j * p.position_stride_stream + b * p.position_stride_b + s * p.position_stride_s);
}

// The first stream whose position of token (b, s) lies outside the table, or -1.
EMBROPE_HD int rope_bad_stream(const RopeParams& p, std::int64_t b, std::int64_t s) {
  for (int j = 0; j < p.streams; ++j) {
    const std::int64_t position = rope_position(p, b, s, j);
    if (position < 0 || position >= p.table_rows) return j;
  }
  return -1;
}

// What a bad-index record says of a token t whose position is bad: the position of its first
// bad stream and the table's range.
EMBROPE_HD BadIndexValue rope_bad_position(const RopeParams& p, std::int64_t t) {
  const std::int64_t b = t / p.seq;
  const std::int64_t s = t - b * p.seq;
  return {rope_position(p, b, s, rope_bad_stream(p, b, s)), 0, p.table_rows};
}

// The stream positions of token (b, s): mrope's temporal, height, width, or an axial call's
// axes (all one without streams; a stream past the call's count repeats the last). Scalars,
// not an array: on the GPU an array indexed at run time would live in local memory.
struct TokenPositions {
  std::int64_t p0, p1, p2, p3;
};
EMBROPE_HD TokenPositions token_positions(const RopeParams& p, std::int64_t b, std::int64_t s) {
  const std::int64_t p0 = rope_position(p, b, s, 0);
  if (!p.mrope) return {p0, p0, p0, p0};
  const std::int64_t p1 = p.streams > 1 ? rope_position(p, b, s, 1) : p0;  // one axis: [1, T]
  const std::int64_t p2 = p.streams > 2 ? rope_position(p, b, s, 2) : p1;
  return {p0, p1, p2, p.streams > 3 ? rope_position(p, b, s, 3) : p2};
}

// A token's position in stream j.
EMBROPE_HD std::int64_t stream_position(const TokenPositions& pos, int j) {
  return j == 0 ? pos.p0 : j == 1 ? pos.p1 : j == 2 ? pos.p2 : pos.p3;
}

// The table row of frequency i of a token: its stream's position.
EMBROPE_HD std::int64_t rope_table_row(const RopeParams& p, const TokenPositions& pos,
                                       std::int64_t i) {
  return stream_position(pos, rope_stream(p, i));
}

// The table's cos and sin (times sin_sign) of pair i of a token, as float32 (exact for every
// table dtype), from a table of C.
template <typename C>
EMBROPE_HD void rope_pair_cos_sin(const RopeParams& p, const TokenPositions& pos, std::int64_t i,
                                  float sin_sign, float& cos_v, float& sin_v) {
  const std::int64_t row = rope_table_row(p, pos, i);
  cos_v = detail::to_float(static_cast<const C*>(p.cos)[row * p.cos_stride + i]);
  sin_v = sin_sign * detail::to_float(static_cast<const C*>(p.sin)[row * p.sin_stride + i]);
}

// The pair of element j < rotary_dim (its frequency), its partner element and whether j is the
// pair's first element.
struct RopePairOf {
  std::int64_t pair, partner;
  bool first;
};
EMBROPE_HD RopePairOf rope_pair_of(const RopeParams& p, std::int64_t j) {
  const std::int64_t half = p.rotary_dim / 2;
  if (p.layout == RopeLayout::neox) {
    return j < half ? RopePairOf{j, j + half, true} : RopePairOf{j - half, j - half, false};
  }
  return (j & 1) == 0 ? RopePairOf{j / 2, j + 1, true} : RopePairOf{j / 2, j - 1, false};
}

// Elements (a, b) of pair i.
EMBROPE_HD std::int64_t rope_pair_first(const RopeParams& p, std::int64_t i) {
  return p.layout == RopeLayout::neox ? i : 2 * i;
}
EMBROPE_HD std::int64_t rope_pair_second(const RopeParams& p, std::int64_t i) {
  return p.layout == RopeLayout::neox ? i + p.rotary_dim / 2 : 2 * i + 1;
}

}  // namespace embrope::internal
