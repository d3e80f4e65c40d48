// The validated, flattened arguments of each op: produced once on the host by src/<op>.cpp
// (prepare), consumed by the CPU kernel (src/cpu/<op>.cpp) and the CUDA kernel
// (cuda/<op>.cu). Kernels trust them. Plain data and __host__ __device__ accessors only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "bad_index.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "embrope/types.hpp"

namespace embrope::detail {

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
  // Multimodal RoPE: frequency i takes its angle from stream detail::mrope_stream(i, ...) of the
  // section sizes, contiguous or interleaved; stream j's positions are at positions + j *
  // position_stride_stream.
  bool mrope = false;
  bool mrope_interleaved = false;
  std::int64_t mrope_section[3] = {0, 0, 0};
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

// Row n of an embed call (a flat row-major index over ids' shape) maps to element offsets in
// ids, out (its leading dimensions), position_ids, type_ids and pre_norm_out.
struct RowIndex {
  enum Operand {
    ids = 0,
    out = 1,
    position_ids = 2,
    type_ids = 3,
    pre_norm_out = 4,   // embed's pre_norm_out; embed_backward's saved pre_norm
    grad_pre_norm = 5,  // embed_backward's grad_pre_norm
    count = 6
  };
  int ndim = 0;
  std::int64_t shape[kMaxDims] = {};
  std::int64_t stride[count][kMaxDims] = {};
};

EMBROPE_HD void row_offsets(const RowIndex& index, std::int64_t row, std::int64_t* offsets) {
  for (int t = 0; t < RowIndex::count; ++t) offsets[t] = 0;
  for (int d = index.ndim - 1; d >= 0; --d) {
    const std::int64_t extent = index.shape[d];
    const std::int64_t coord = row % extent;
    row /= extent;
    for (int t = 0; t < RowIndex::count; ++t) offsets[t] += coord * index.stride[t][d];
  }
}

struct EmbedParams {
  DType dtype = DType::float32;  // of every table and of out
  std::int64_t rows = 0;         // number of ids
  std::int64_t dim = 0;          // D
  RowIndex index;
  const void* ids = nullptr;
  DType id_dtype = DType::int64;
  void* out = nullptr;

  const void* table = nullptr;
  std::int64_t vocab_size = 0, table_stride = 0, vocab_start = 0;
  bool vocab_shard = false;
  float scale = 1.0f;

  PositionEncoding positions = PositionEncoding::none;
  const void* position_table = nullptr;
  std::int64_t max_positions = 0, position_table_stride = 0;
  const void* position_ids = nullptr;  // null: implicit offset_b + s
  DType position_id_dtype = DType::int64;
  const void* position_offsets = nullptr;  // null: offsets are 0
  DType position_offset_dtype = DType::int64;
  std::int64_t position_offset_stride = 0;
  std::int64_t seq_len = 1;  // S of implicit positions: row n is (b, s) = (n / S, n % S)
  double sinusoid_base = 10000.0;
  SinusoidLayout sinusoid_layout = SinusoidLayout::interleaved;

  const void* type_table = nullptr;
  std::int64_t num_types = 0, type_table_stride = 0;
  const void* type_ids = nullptr;
  DType type_id_dtype = DType::int64;

  // Normalisation of the summed row (detail/norm_math.hpp). weight and bias: [D] contiguous,
  // null when absent (1 and 0).
  Normalization norm = Normalization::none;
  const void* norm_weight = nullptr;
  DType norm_weight_dtype = DType::float32;
  const void* norm_bias = nullptr;
  DType norm_bias_dtype = DType::float32;
  float norm_eps = 0.0f;
  bool norm_unit_offset = false;
  void* pre_norm_out = nullptr;  // the summed row before normalisation, or null
  DType pre_norm_dtype = DType::float32;

  BadIndexRecord* bad = nullptr;
};

// Element j of a [D] vector of float32 or of 16-bit values (a norm weight or bias), as float32.
EMBROPE_HD float load_vector_value(const void* base, DType dtype, std::int64_t j) {
  return dtype == DType::float32   ? static_cast<const float*>(base)[j]
         : dtype == DType::float16 ? to_float(static_cast<const Half*>(base)[j])
                                   : to_float(static_cast<const BFloat16*>(base)[j]);
}

// Stores x, rounded once, as element `offset` of a float32 or 16-bit value tensor.
EMBROPE_HD void store_value(void* base, DType dtype, std::int64_t offset, float x) {
  if (dtype == DType::float32) {
    static_cast<float*>(base)[offset] = x;
  } else if (dtype == DType::float16) {
    static_cast<Half*>(base)[offset] = from_float<Half>(x);
  } else {
    static_cast<BFloat16*>(base)[offset] = from_float<BFloat16>(x);
  }
}

struct PackedPositionsParams {
  const void* cu_seqlens = nullptr;  // [B + 1]
  DType cu_dtype = DType::int64;
  std::int64_t cu_stride = 1;
  std::int64_t sequences = 0;           // B
  const void* start_offsets = nullptr;  // [B] or null
  DType start_dtype = DType::int64;
  std::int64_t start_stride = 0;
  void* positions = nullptr;  // [T]
  DType position_dtype = DType::int64;
  std::int64_t position_stride = 1;
  std::int64_t tokens = 0;  // T
  BadIndexRecord* bad = nullptr;
  void* workspace = nullptr;  // CUDA: the caller's workspace; null: allocate on the stream
  std::size_t workspace_bytes = 0;
};

// Loads an index element of either index dtype.
EMBROPE_HD std::int64_t load_index(const void* base, DType dtype, std::int64_t offset) {
  return dtype == DType::int32
             ? static_cast<std::int64_t>(static_cast<const std::int32_t*>(base)[offset])
             : static_cast<const std::int64_t*>(base)[offset];
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
    return from_float<T>(x);
  } else {
    return from_float<O>(x * scale);
  }
}

// A float8 output element's code: x * scale rounded once to dtype (float8_e4m3fn or
// float8_e5m2), the bits of rope_output_value for a dtype known at run time.
EMBROPE_HD std::uint8_t rope_float8_code(float x, float scale, DType dtype) {
  return dtype == DType::float8_e4m3fn ? float_to_float8_e4m3(x * scale)
                                       : float_to_float8_e5m2(x * scale);
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
  return p.mrope ? mrope_stream(i, p.mrope_section, p.mrope_interleaved) : 0;
}
EMBROPE_HD int rope_chunk_stream(const RopeParams& p, std::int64_t first, std::int64_t n) {
  return p.mrope ? mrope_chunk_stream(first, n, p.mrope_section, p.mrope_interleaved) : 0;
}

// The position of token (b, s) of a RoPE call in stream j (always 0 unless mrope).
EMBROPE_HD std::int64_t rope_position(const RopeParams& p, std::int64_t b, std::int64_t s, int j) {
  return load_index(
      p.positions, p.position_dtype,
      j * p.position_stride_stream + b * p.position_stride_b + s * p.position_stride_s);
}

// The first stream whose position of token (b, s) lies outside the table, or -1.
EMBROPE_HD int rope_bad_stream(const RopeParams& p, std::int64_t b, std::int64_t s) {
  const int streams = p.mrope ? 3 : 1;
  for (int j = 0; j < streams; ++j) {
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

// The stream positions of token (b, s): temporal, height, width (all one without mrope). Three
// scalars, not an array: on the GPU an array indexed at run time would live in local memory.
struct TokenPositions {
  std::int64_t p0, p1, p2;
};
EMBROPE_HD TokenPositions token_positions(const RopeParams& p, std::int64_t b, std::int64_t s) {
  const std::int64_t p0 = rope_position(p, b, s, 0);
  if (!p.mrope) return {p0, p0, p0};
  return {p0, rope_position(p, b, s, 1), rope_position(p, b, s, 2)};
}

// The table row of frequency i of a token: its stream's position.
EMBROPE_HD std::int64_t rope_table_row(const RopeParams& p, const TokenPositions& pos,
                                       std::int64_t i) {
  const int stream = rope_stream(p, i);
  return stream == 0 ? pos.p0 : (stream == 1 ? pos.p1 : pos.p2);
}

// The table's cos and sin (times sin_sign) of pair i of a token, as float32 (exact for every
// table dtype), from a table of C.
template <typename C>
EMBROPE_HD void rope_pair_cos_sin(const RopeParams& p, const TokenPositions& pos, std::int64_t i,
                                  float sin_sign, float& cos_v, float& sin_v) {
  const std::int64_t row = rope_table_row(p, pos, i);
  cos_v = to_float(static_cast<const C*>(p.cos)[row * p.cos_stride + i]);
  sin_v = sin_sign * to_float(static_cast<const C*>(p.sin)[row * p.sin_stride + i]);
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

// ------------------------------------------------------------- apply_qk_norm_rope ----

// The per-head RMSNorm of q and k rows (apply_qk_norm_rope, apply_qk_norm_rope_append_kv).
struct QkNormWeights {
  // [D] weights, null when absent (1).
  const void* q_weight = nullptr;
  const void* k_weight = nullptr;
  DType q_weight_dtype = DType::float32, k_weight_dtype = DType::float32;
  float eps = 0.0f;
  bool unit_offset = false;
};

struct QkNormRopeParams {
  // The rotation and its rows. Forward: rope.q.in is q, rope.q.out the output. Backward:
  // rope.q.in is dq (the output's gradient), rope.q.out the input's gradient, and rope.inverse
  // already transposed (the rotation dq is turned by).
  RopeParams rope;
  QkNormWeights norm;
  // Backward: the forward's inputs (in and the strides; out unused) and the weight gradients
  // ([D] float32, null when not requested).
  RopeHeads saved_q, saved_k;
  float* q_weight_grad = nullptr;
  float* k_weight_grad = nullptr;
  void* workspace = nullptr;  // CUDA, with a weight gradient; null: allocate on the stream
  std::size_t workspace_bytes = 0;
};

// The weight factor of element j of a q (is_q) or k row: 1, w_j, or 1 + w_j.
EMBROPE_HD float qk_norm_weight(const QkNormWeights& n, bool is_q, std::int64_t j) {
  const void* w = is_q ? n.q_weight : n.k_weight;
  if (w == nullptr) return 1.0f;
  return norm_weight_factor(load_vector_value(w, is_q ? n.q_weight_dtype : n.k_weight_dtype, j),
                            n.unit_offset);
}

// The saved forward input of head h of token (b, s) of q (is_q) or k.
template <typename T>
EMBROPE_HD const T* qk_saved_row(const QkNormRopeParams& p, bool is_q, std::int64_t b,
                                 std::int64_t s, std::int64_t h) {
  const RopeHeads& x = is_q ? p.saved_q : p.saved_k;
  return static_cast<const T*>(x.in) + b * x.in_stride_b + s * x.in_stride_s + h * x.in_stride_h;
}

// ------------------------------------------------------------ apply_rope_append_kv ----

// One of the k and v caches: row (page, slot offset, head) starts at
// data + page * stride_page + offset * stride_offset + head * stride_head (elements).
struct KvCacheSide {
  void* data = nullptr;
  DType dtype = DType::float32;
  std::int64_t stride_page = 0, stride_offset = 0, stride_head = 0;
  std::int64_t head_dim = 0;
  float scale = 1.0f;  // float8: the stored value is value / scale
};

struct RopeAppendKvParams {
  // q's and k's rotation. rope.k.out is k_out when write_k_out, else unused (k is only read).
  RopeParams rope;
  bool write_k_out = false;
  // v [B, S, Hk, Dv] (dtype rope.dtype).
  const void* v = nullptr;
  std::int64_t v_stride_b = 0, v_stride_s = 0, v_stride_h = 0;
  KvCacheSide k_cache, v_cache;
  std::int64_t pages = 0, page_size = 0;
  // Slots: slot_mapping [B, S] when non-null; otherwise cache_offsets [B] (and, for packed
  // inputs, cu_seqlens [sequences + 1]).
  const void* slot_mapping = nullptr;
  DType slot_dtype = DType::int64;
  std::int64_t slot_stride_b = 0, slot_stride_s = 0;
  const void* cache_offsets = nullptr;
  DType offset_dtype = DType::int64;
  std::int64_t offset_stride = 0;
  const void* cu_seqlens = nullptr;
  DType cu_dtype = DType::int64;
  std::int64_t cu_stride = 0, sequences = 0;
  // apply_qk_norm_rope_append_kv: q's and k's rows are normalised before the rotation.
  bool qk_norm = false;
  QkNormWeights norm;
};

// Where token (b, s)'s cache rows go. `value` is what a report names (the slot as given, or
// the write position cache_offsets[b] + s) and [lower, upper) its valid range.
struct KvSlot {
  enum State { write, skip, bad } state;
  std::int64_t page, offset;
  BadIndexValue value;
};

EMBROPE_HD KvSlot kv_slot(const RopeAppendKvParams& p, std::int64_t b, std::int64_t s) {
  if (p.slot_mapping != nullptr) {
    const std::int64_t slot =
        load_index(p.slot_mapping, p.slot_dtype, b * p.slot_stride_b + s * p.slot_stride_s);
    const BadIndexValue value{slot, 0, p.pages * p.page_size};
    if (slot == -1) return {KvSlot::skip, 0, 0, value};
    if (slot < 0 || slot >= value.upper) return {KvSlot::bad, 0, 0, value};
    return {KvSlot::write, slot / p.page_size, slot % p.page_size, value};
  }
  std::int64_t sequence = b, offset_in_sequence = s;
  if (p.cu_seqlens != nullptr) {
    // Packed: b is 0 and s the token; its sequence is the last one starting at or before it.
    std::int64_t lo = 0, hi = p.sequences - 1;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo + 1) / 2;
      if (load_index(p.cu_seqlens, p.cu_dtype, mid * p.cu_stride) <= s) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    sequence = lo;
    offset_in_sequence = s - load_index(p.cu_seqlens, p.cu_dtype, lo * p.cu_stride);
  }
  const std::int64_t start =
      load_index(p.cache_offsets, p.offset_dtype, sequence * p.offset_stride);
  // Written so that no sum overflows: a start past the cache is bad whatever the token.
  const bool in_range = start >= 0 && start < p.page_size && offset_in_sequence >= 0 &&
                        offset_in_sequence < p.page_size - start;
  // The write position start + offset, saturated where the sum would overflow.
  const std::int64_t position = offset_in_sequence > 0 && start > INT64_MAX - offset_in_sequence
                                    ? INT64_MAX
                                : offset_in_sequence < 0 && start < INT64_MIN - offset_in_sequence
                                    ? INT64_MIN
                                    : start + offset_in_sequence;
  const BadIndexValue value{position, 0, p.page_size};
  if (!in_range) return {KvSlot::bad, 0, 0, value};
  return {KvSlot::write, sequence, start + offset_in_sequence, value};
}

// The first cache row of k (v) head h of a slot.
template <typename C>
EMBROPE_HD C* kv_cache_row(const KvCacheSide& c, std::int64_t page, std::int64_t offset,
                           std::int64_t h) {
  return static_cast<C*>(c.data) + page * c.stride_page + offset * c.stride_offset +
         h * c.stride_head;
}

// packed_positions: entry b of cu_seqlens and of start_offsets (0 when absent).
EMBROPE_HD std::int64_t cu_seqlens_at(const PackedPositionsParams& p, std::int64_t b) {
  return load_index(p.cu_seqlens, p.cu_dtype, b * p.cu_stride);
}
EMBROPE_HD std::int64_t start_offset_at(const PackedPositionsParams& p, std::int64_t b) {
  return p.start_offsets == nullptr
             ? 0
             : load_index(p.start_offsets, p.start_dtype, b * p.start_stride);
}

// cu_seqlens[b] and the range [lower, upper) it must lie in, given the entry before it (0 for
// b = 0): entry 0 is 0, entry B is T, the others lie in [previous, T].
EMBROPE_HD BadIndexValue cu_seqlens_entry(const PackedPositionsParams& p, std::int64_t b,
                                          std::int64_t previous) {
  BadIndexValue v{cu_seqlens_at(p, b), b == 0 ? 0 : previous, b == 0 ? 1 : p.tokens + 1};
  if (b == p.sequences) {  // the last entry is T (for B = 0 the only entry is both 0 and T)
    v.lower = v.lower > p.tokens ? v.lower : p.tokens;
    v.upper = v.upper < p.tokens + 1 ? v.upper : p.tokens + 1;
  }
  return v;
}
EMBROPE_HD bool entry_in_range(const BadIndexValue& v) {
  return v.value >= v.lower && v.value < v.upper;
}

// The largest start offset that keeps a sequence of `length` tokens representable.
EMBROPE_HD std::int64_t max_start_offset(const PackedPositionsParams& p, std::int64_t length) {
  const std::int64_t top = p.position_dtype == DType::int32 ? INT32_MAX : INT64_MAX;
  return length == 0 ? top : top - (length - 1);
}

// Sequence b's start offset, valid when in [0, max_start_offset]; its range as a record says
// it is [0, max_start_offset + 1), saturated at INT64_MAX.
EMBROPE_HD std::int64_t sequence_length(const PackedPositionsParams& p, std::int64_t b) {
  return cu_seqlens_at(p, b + 1) - cu_seqlens_at(p, b);
}
EMBROPE_HD bool start_offset_valid(const PackedPositionsParams& p, std::int64_t b,
                                   std::int64_t start) {
  return start >= 0 && start <= max_start_offset(p, sequence_length(p, b));
}
EMBROPE_HD BadIndexValue start_offset_entry(const PackedPositionsParams& p, std::int64_t b) {
  const std::int64_t m = max_start_offset(p, sequence_length(p, b));
  return {start_offset_at(p, b), 0, m == INT64_MAX ? INT64_MAX : m + 1};
}

EMBROPE_HD void store_index(void* base, DType dtype, std::int64_t offset, std::int64_t value) {
  if (dtype == DType::int32) {
    static_cast<std::int32_t*>(base)[offset] = static_cast<std::int32_t>(value);
  } else {
    static_cast<std::int64_t*>(base)[offset] = value;
  }
}

// ----------------------------------------------------------------- embed_backward ----

// One gradient table of embed_backward: [rows, D] with row stride `stride`, float32 or the
// dtype of grad_out. grad += weight * (sum of the grad_out rows that map to a row).
struct GradTable {
  void* grad = nullptr;  // null: not requested
  DType dtype = DType::float32;
  std::int64_t rows = 0, stride = 0;
  float weight = 1.0f;
};

struct EmbedBackwardParams {
  // The forward's row resolution (ids, positions, type ids and their range checks) with
  // grad_out in the place of out: rows.out is grad_out, rows.dtype its dtype. The forward's
  // table pointers are unused, except that rows.type_table is non-null exactly when type
  // gradients are requested (resolve_embed_row reads type ids only then).
  EmbedParams rows;
  // The three gradients, in key order: token table, position table, type table.
  enum Target { token = 0, position = 1, type = 2, count = 3 };
  GradTable targets[count];
  bool has_padding = false;
  std::int64_t padding_idx = 0;
  BackwardMode mode = BackwardMode::deterministic;
  void* workspace = nullptr;  // CUDA deterministic mode; null: allocate on the stream
  std::size_t workspace_bytes = 0;

  // embed's norm, differentiated first (norm_backward_row on the CPU, the norm kernels on the
  // GPU): rows.norm, rows.norm_weight (and its dtype), rows.norm_eps and
  // rows.norm_unit_offset are the forward's; pre_norm (offsets: RowIndex::pre_norm_out) is
  // the saved pre-norm row; grad_pre_norm (RowIndex::grad_pre_norm) the gradient it received
  // directly, or null. The table gradients then sum the float32 rows dx the norm's backward
  // wrote (norm_scatter_params).
  const void* pre_norm = nullptr;
  DType pre_norm_dtype = DType::float32;
  const void* grad_pre_norm = nullptr;
  DType grad_pre_norm_dtype = DType::float32;
  float* grad_norm_weight = nullptr;  // [D] float32, overwritten; null: not requested
  float* grad_norm_bias = nullptr;    // the same for the bias (layer_norm)
};

}  // namespace embrope::detail
