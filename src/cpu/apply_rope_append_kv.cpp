// RoPE + KV-cache append on the CPU: one pass over the tokens (OpenMP), each token rotated
// by apply_rope's own per-token rotation (rotate_one_token: the same instruction set and
// bits), or normalised and rotated by apply_qk_norm_rope's per-token kernel
// (qk_norm_rope_one_token, apply_qk_norm_rope_append_kv), its rotated k rows written straight into
// the cache when the cache has the activations' dtype (else through a per-thread row converted to
// the cache dtype), and its v rows copied or converted. Conversions: detail/numeric_types.hpp.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "isa.hpp"
#include "per_thread.hpp"
#include "token_schedule.hpp"

namespace embrope::cpu {

using detail::from_float;
using detail::to_float;

#define EMBROPE_VECTOR_BODY "float8.inc"
#include "vector_bodies.hpp"
#include "float8.hpp"

namespace {

// heads rows of dim elements of T (row h at src + h * src_stride) into the cache rows of a
// slot, converted to the cache dtype C (float8: value / scale).
template <typename T, typename C>
void store_rows(const T* src, std::int64_t src_stride, const internal::KvCacheSide& cache,
                std::int64_t page, std::int64_t offset, std::int64_t heads) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const T* in = src + h * src_stride;
    C* out = internal::kv_cache_row<C>(cache, page, offset, h);
    if constexpr (std::is_same_v<T, C>) {
      std::memcpy(out, in, static_cast<std::size_t>(cache.head_dim) * sizeof(T));
    } else if constexpr (std::is_same_v<C, detail::Float8E4M3> ||
                         std::is_same_v<C, detail::Float8E5M2>) {
      divide_into_float8(in, out, cache.head_dim, cache.scale);
    } else {
#pragma omp simd
      for (std::int64_t e = 0; e < cache.head_dim; ++e) out[e] = from_float<C>(to_float(in[e]));
    }
  }
}

template <typename T>
void store_rows(const T* src, std::int64_t src_stride, const internal::KvCacheSide& cache,
                std::int64_t page, std::int64_t offset, std::int64_t heads) {
  internal::dispatch_cache_dtype(cache.dtype, [&](auto c) {
    store_rows<T, typename decltype(c)::type>(src, src_stride, cache, page, offset, heads);
  });
}

// The rotation parameters of token (b, s) alone: batch = seq = 1, every pointer at the token
// (strides count elements: q's output and q_nope's are in the output dtype).
internal::RopeParams token_params(const internal::RopeParams& p, std::int64_t b, std::int64_t s) {
  internal::RopeParams t = p;
  t.batch = 1;
  t.seq = 1;
  t.positions = static_cast<const char*>(p.positions) +
                (b * p.position_stride_b + s * p.position_stride_s) * dtype_size(p.position_dtype);
  t.position_stride_b = t.position_stride_s = 0;
  const auto at_token = [&](internal::RopeHeads& x, std::int64_t out_size) {
    x.in = static_cast<const char*>(x.in) +
           (b * x.in_stride_b + s * x.in_stride_s) * dtype_size(p.dtype);
    x.out = static_cast<char*>(x.out) + (b * x.out_stride_b + s * x.out_stride_s) * out_size;
    x.in_stride_b = x.in_stride_s = x.out_stride_b = x.out_stride_s = 0;
  };
  at_token(t.q, dtype_size(p.out_dtype));
  at_token(t.k, dtype_size(p.dtype));
  at_token(t.q_nope, dtype_size(p.out_dtype));
  return t;
}

template <typename T>
void append_kv(const internal::RopeAppendKvParams& p) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t kv_heads = r.k.heads;
  const bool direct = p.k_cache.dtype == r.dtype;  // rotate k straight into the cache
  const bool k_written = p.write_k_out;
  const bool quantized = internal::rope_quantized(r);  // q_out float8
  // The qk-norm's weight factors (q's, then k's), once per call.
  std::vector<float> weights(p.qk_norm ? static_cast<std::size_t>(2 * r.head_dim) : 0);
  if (p.qk_norm) {
    internal::QkNormRopeParams call;
    call.rope = r;
    call.norm = p.norm;
    qk_norm_weight_factors(call, weights.data());
  }

  // Token t: rotate, write its cache rows; returns its bad-index key.
  const auto token = [&](std::int64_t t, float* widened, T* scratch) -> std::int64_t {
    const std::int64_t b = t / r.seq, s = t % r.seq;
    const internal::KvSlot slot = internal::kv_slot(p, b, s);
    const std::int64_t slot_key = internal::bad_index_key(
        t, p.slot_mapping != nullptr ? internal::BadIndexArg::slot_mapping
                                     : internal::BadIndexArg::cache_offsets);
    // A float8 q (the op's only float8 output) is rotated apart from k, whose rows keep k's
    // dtype: q_part holds q's rows (and q_nope's), `one` k's.
    internal::RopeParams one = token_params(r, b, s);
    internal::RopeParams q_part = one;
    q_part.has_k = false;
    if (quantized) {
      one.q.heads = 0;
      one.q_nope.heads = 0;
      one.out_dtype = r.dtype;
    }
    if (internal::rope_bad_stream(r, b, s) >= 0) {
      zero_one_token(q_part);
      for (std::int64_t h = 0; k_written && h < kv_heads; ++h) {
        T* out = internal::rope_row<T>(r, b, s, r.q.heads + h).out;
        std::fill(out, out + r.head_dim, from_float<T>(0.0f));
      }
      return internal::bad_index_key(t, internal::BadIndexArg::positions);
    }
    const bool write = slot.state == internal::KvSlot::write;
    // Where rotated k goes: k_out, the cache row itself, the scratch rows, or nowhere.
    const T* rotated_k = nullptr;
    std::int64_t rotated_stride = 0;
    if (k_written) {
      rotated_k = static_cast<const T*>(one.k.out);
      rotated_stride = one.k.out_stride_h;
    } else if (write && direct) {
      one.k.out = internal::kv_cache_row<T>(p.k_cache, slot.page, slot.offset, 0);
      one.k.out_stride_h = p.k_cache.stride_head;
    } else if (write) {
      one.k.out = scratch;
      one.k.out_stride_h = r.head_dim;
      rotated_k = scratch;
      rotated_stride = r.head_dim;
    } else {
      one.has_k = false;
    }
    for (const internal::RopeParams* part : {quantized ? &q_part : nullptr, &one}) {
      if (part == nullptr || internal::rope_rotated_heads(*part) == 0) continue;
      if (p.qk_norm) {
        internal::QkNormRopeParams normalized;
        normalized.rope = *part;
        normalized.norm = p.norm;
        qk_norm_rope_one_token(normalized, weights.data(), widened);
      } else {
        rotate_one_token(*part, widened);
      }
    }
    if (!write) return slot.state == internal::KvSlot::bad ? slot_key : internal::kNoBadIndex;
    if (rotated_k != nullptr) {
      store_rows<T>(rotated_k, rotated_stride, p.k_cache, slot.page, slot.offset, kv_heads);
    }
    const T* v = static_cast<const T*>(p.v) + b * p.v_stride_b + s * p.v_stride_s;
    store_rows<T>(v, p.v_stride_h, p.v_cache, slot.page, slot.offset, kv_heads);
    return internal::kNoBadIndex;
  };

  // Per thread: the rotation's widened cos/sin row, or the qk-norm's scratch.
  internal::QkNormRopeParams normalized;
  normalized.rope = r;
  normalized.norm = p.norm;
  const std::size_t widened_floats =
      static_cast<std::size_t>(p.qk_norm ? qk_norm_token_floats(normalized) : 3 * r.rotary_dim);
  // Rotated k goes through the scratch rows only on its way to a cache of another dtype, so
  // they are made only then, and left uninitialised (each row is written whole before it is
  // read): a std::vector of 16-bit values made in every call was filled element by element, and
  // Llama-3-8B's one-token call (8 kv heads) went from 1.6 to 1.2 us without it.
  const std::size_t scratch_elements =
      direct || k_written ? 0 : static_cast<std::size_t>(kv_heads * r.head_dim);
  std::int64_t first_bad = internal::kNoBadIndex;
  const std::int64_t elements =
      tokens * ((r.q.heads + kv_heads) * r.head_dim + kv_heads * p.v_cache.head_dim +
                r.q_nope.heads * r.q_nope_dim);
  struct Scratch {
    std::vector<float> widened;
    std::unique_ptr<T[]> k_rows;
    Scratch(std::size_t widened_floats, std::size_t k_elements)
        : widened(widened_floats), k_rows(k_elements > 0 ? new T[k_elements] : nullptr) {}
  };
  if (tokens <= 1 || elements < (1 << 15)) {
    Scratch scratch(widened_floats, scratch_elements);
    for (std::int64_t t = 0; t < tokens; ++t) {
      first_bad = std::min(first_bad, token(t, scratch.widened.data(), scratch.k_rows.get()));
    }
  } else {
    PerThread<Scratch> scratches(true, widened_floats, scratch_elements);
#pragma omp parallel num_threads(scratches.threads()) reduction(min : first_bad)
    {
      Scratch& scratch = scratches.mine();
#pragma omp for EMBROPE_TOKEN_SCHEDULE
      for (std::int64_t t = 0; t < tokens; ++t) {
        first_bad = std::min(first_bad, token(t, scratch.widened.data(), scratch.k_rows.get()));
      }
    }
  }
  internal::lower_bad_index(r.bad, first_bad, r.bad_op, [&](std::int64_t key) {
    const std::int64_t t = internal::bad_index_row(key);
    if (internal::bad_index_arg(key) == internal::BadIndexArg::positions) {
      return internal::rope_bad_position(r, t);
    }
    return internal::kv_slot(p, t / r.seq, t % r.seq).value;
  });
}

}  // namespace

void apply_rope_append_kv(const internal::RopeAppendKvParams& p) {
  internal::dispatch_value_dtype(p.rope.dtype,
                                 [&](auto t) { append_kv<typename decltype(t)::type>(p); });
}

void apply_qk_norm_rope_append_kv(const internal::RopeAppendKvParams& p) {
  apply_rope_append_kv(p);
}

}  // namespace embrope::cpu
