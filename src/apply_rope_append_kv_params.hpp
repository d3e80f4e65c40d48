// apply_rope_append_kv's (and apply_qk_norm_rope_append_kv's) parameters: RoPE's, v, the
// caches and where each token's rows go (apply_rope_params.hpp says how parameters are made
// and used).
#pragma once

#include <cstdint>

#include "apply_qk_norm_rope_params.hpp"
#include "apply_rope_params.hpp"
#include "bad_index.hpp"
#include "embrope/detail/config.hpp"
#include "tensor_access.hpp"

namespace embrope::internal {

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

}  // namespace embrope::internal
