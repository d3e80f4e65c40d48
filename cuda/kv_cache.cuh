// The KV-cache side of the fused RoPE + append kernels (apply_rope_append_kv.cu and
// apply_qk_norm_rope.cu's apply_qk_norm_rope_append_kv): where a cache row starts, the
// conversion of activations into the cache dtype (float8: value / scale, saturating, as
// detail::float_to_float8), and the description of a bad token.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../src/apply_rope_append_kv_params.hpp"
#include "bad_index.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "vector.cuh"

namespace embrope::gpu {

// Token (b, s) of a fused RoPE + append call: whether its position is bad, its cache slot, and
// whether its k and v rows go into the cache (a good position and a slot to write).
struct TokenCacheWrite {
  bool bad_position = false;
  internal::KvSlot slot{internal::KvSlot::skip, 0, 0, {}};
  bool write = false;
};
__device__ __forceinline__ TokenCacheWrite token_cache_write(const internal::RopeAppendKvParams& p,
                                                             std::int64_t b, std::int64_t s) {
  TokenCacheWrite w;
  w.bad_position = internal::rope_bad_stream(p.rope, b, s) >= 0;
  w.slot = internal::kv_slot(p, b, s);
  w.write = !w.bad_position && w.slot.state == internal::KvSlot::write;
  return w;
}

// Run by one thread per token t: reports its bad position, or else its bad cache slot.
__device__ __forceinline__ void report_bad_token(const internal::RopeAppendKvParams& p,
                                                 std::int64_t t, const TokenCacheWrite& token) {
  if (token.bad_position) {
    report_bad_row(p.rope.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
  } else if (token.slot.state == internal::KvSlot::bad) {
    report_bad_row(p.rope.bad,
                   internal::bad_index_key(t, p.slot_mapping != nullptr
                                                  ? internal::BadIndexArg::slot_mapping
                                                  : internal::BadIndexArg::cache_offsets));
  }
}

// Run by one thread of the last block: describes the record's key if it names a token of
// this call (a bad position, or a bad slot).
__device__ inline void describe_bad_token(const internal::RopeAppendKvParams& p) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t key = current_key(r.bad);
  const std::int64_t t = internal::bad_index_row(key);
  if (key == internal::kNoBadIndex || t >= r.batch * r.seq) return;
  const std::int64_t b = t / r.seq, s = t - b * r.seq;
  const internal::BadIndexArg arg = internal::bad_index_arg(key);
  if (arg == internal::BadIndexArg::positions && internal::rope_bad_stream(r, b, s) >= 0) {
    internal::describe_bad_index(r.bad, r.bad_op, internal::rope_bad_position(r, t));
  } else if ((arg == internal::BadIndexArg::slot_mapping ||
              arg == internal::BadIndexArg::cache_offsets) &&
             internal::kv_slot(p, b, s).state == internal::KvSlot::bad) {
    internal::describe_bad_index(r.bad, r.bad_op, internal::kv_slot(p, b, s).value);
  }
}

// W activations into the cache at element `at` (from c.data), converted to its dtype C.
template <bool kVector, typename C, typename T, int W>
__device__ __forceinline__ void store_to_cache(void* data, std::int64_t at, const Chunk<T, W>& x,
                                               float scale) {
  Chunk<C, W> converted;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    if constexpr (std::is_same_v<C, T>) {
      converted.v[w] = x.v[w];
    } else if constexpr (std::is_same_v<C, detail::Float8E4M3> ||
                         std::is_same_v<C, detail::Float8E5M2>) {
      converted.v[w] = detail::from_float<C>(detail::to_float(x.v[w]) / scale);
    } else {
      converted.v[w] = detail::from_float<C>(detail::to_float(x.v[w]));
    }
  }
  store_elements<kVector>(static_cast<C*>(data) + at, converted);
}
template <bool kVector, typename T, int W>
__device__ __forceinline__ void store_to_cache(const internal::KvCacheSide& c, std::int64_t at,
                                               const Chunk<T, W>& x) {
  switch (c.dtype) {
    case DType::float32:
      return store_to_cache<kVector, float>(c.data, at, x, c.scale);
    case DType::float16:
      return store_to_cache<kVector, detail::Half>(c.data, at, x, c.scale);
    case DType::bfloat16:
      return store_to_cache<kVector, detail::BFloat16>(c.data, at, x, c.scale);
    case DType::float8_e4m3fn:
      return store_to_cache<kVector, detail::Float8E4M3>(c.data, at, x, c.scale);
    default:
      return store_to_cache<kVector, detail::Float8E5M2>(c.data, at, x, c.scale);
  }
}

// The first element of cache row (page, offset, head), counted from c.data.
__device__ __forceinline__ std::int64_t cache_row(const internal::KvCacheSide& c, std::int64_t page,
                                                  std::int64_t offset, std::int64_t h) {
  return page * c.stride_page + offset * c.stride_offset + h * c.stride_head;
}

}  // namespace embrope::gpu
