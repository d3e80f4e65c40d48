// RoPE + KV-cache append on the GPU, one launch: Su et al. 2021 (RoFormer) rotation of q and
// k by detail::rotate_pair through rope.cuh, as apply_rope.cu does it, with the rotated k and the v
// rows written into a paged (vLLM slot_mapping, NHD or HND) or contiguous KV cache, converted to
// the cache dtype (float8: detail::float_to_float8, value / scale, saturating). After
// FlashInfer's fused RoPE + FP8 append (pos_enc.cuh) and TensorRT-LLM's QKV preprocessing.
//
// One kernel, templated on the activations' dtype, the pair layout and the access width:
// - vector (kVector): 16-byte loads and stores; threadIdx.x owns one chunk of rotation
//   pairs (neox: kVec elements of each half; interleaved: kVec consecutive elements), whose
//   cos/sin it loads once per token; threadIdx.y a head row (q heads, then k, then v);
// - general: one pair per thread, scalar accesses, any table dtype, alignment or size.
// A float8 q_out's rows (and q_nope's, rows after v's) are written pair by pair on either
// path: rotated in float32, scaled by the head's scale, rounded once (rope_float8_code).
// Blocks take whole tokens when there are enough to fill the GPU, and split a token's rows
// otherwise (decode). Each thread owns whole pairs, so in place is race-free.
#include <algorithm>
#include <cstdint>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "bad_index.cuh"
#include "common.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "kv_cache.cuh"
#include "rope.cuh"
#include "vector.cuh"

namespace embrope::gpu {
namespace {

using detail::from_float;
using detail::to_float;

// (256, 1): with the bound alone ptxas aimed at a tighter register budget and spilled around
// the float8 path's IEEE division (a slow-path call) in four instantiations; with one block
// per SM allowed it uses 55-115 registers and no local memory. C: the cos/sin table's element
// type on the vector path (float, or T: a 16-bit table of the activations' dtype); the general
// path reads a table of any value dtype pair by pair (C unused, float).
template <typename T, RopeLayout kLayout, bool kVector, typename C = float>
__global__ void __launch_bounds__(256, 1)
    append_kv_kernel(const __grid_constant__ internal::RopeAppendKvParams p,
                     std::int64_t rows_per_split) {
  constexpr bool kNeox = kLayout == RopeLayout::neox;
  constexpr int kVec = kVector ? kVec16<T> : (kNeox ? 1 : 2);  // elements per chunk
  constexpr int kPairs = kChunkPairs<kLayout, kVec>;
  const internal::RopeParams& r = p.rope;
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t q_heads = r.q.heads, kv_heads = r.k.heads;
  // q heads, k heads, v heads, then q_nope's (float8 q_out's non-rotary part) heads.
  const std::int64_t rows = q_heads + 2 * kv_heads + r.q_nope.heads;
  const bool q_float8 = internal::rope_quantized(r);
  const std::int64_t half = r.rotary_dim / 2;
  const std::int64_t rotary_chunks = (kNeox ? half : r.rotary_dim) / kVec;
  const std::int64_t row_begin = blockIdx.y * rows_per_split;
  const std::int64_t row_end = min(rows, row_begin + rows_per_split);
  const bool k_written = p.write_k_out;
  // Copies (v rows, pass-through elements, zero fills): whole chunks, or one element.
  constexpr int kCopy = kVector ? kVec : 1;
  const Chunk<T, kCopy> zero = {};

  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t b = t / r.seq;
    const std::int64_t s = t - b * r.seq;
    const TokenCacheWrite token = token_cache_write(p, b, s);
    if (threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.y == 0) {
      report_bad_token(p, t, token);
    }
    // The vector path's thread owns rotary chunk threadIdx.x: its cos/sin, once per token.
    float c[kPairs] = {}, sn[kPairs] = {};
    if (kVector && !token.bad_position && threadIdx.x < rotary_chunks) {
      load_cos_sin<kVector, true, C>(r, b, s, threadIdx.x * kPairs, c, sn);
    }
    for (std::int64_t h = row_begin + threadIdx.y; h < row_end; h += blockDim.y) {
      if (h >= q_heads + 2 * kv_heads) {
        // A q_nope row: quantized with q's head scale into q_nope_out.
        const internal::RopeNopeRow<T, std::uint8_t> nope =
            internal::rope_nope_row<T, std::uint8_t>(r, b, s, h - q_heads - 2 * kv_heads);
        const float scale = internal::rope_out_scale(r, nope.head);
        for (std::int64_t e = threadIdx.x; e < nope.dim; e += blockDim.x) {
          nope.out[e] = token.bad_position
                            ? std::uint8_t{0}
                            : internal::rope_float8_code(to_float(nope.in[e]), scale, r.out_dtype);
        }
        continue;
      }
      if (q_float8 && h < q_heads) {
        // A q row into a float8 q_out: pair by pair (rotated in float32, scaled, rounded once).
        const internal::RopeRow<T, std::uint8_t> row8 =
            internal::heads_row<T, std::uint8_t>(r.q, b, s, h);
        const float scale = internal::rope_out_scale(r, h);
        if (token.bad_position) {
          for (std::int64_t e = threadIdx.x; e < r.head_dim; e += blockDim.x) row8.out[e] = 0;
          continue;
        }
        for (std::int64_t i = threadIdx.x; i < half; i += blockDim.x) {
          float pair_c[1], pair_s[1];
          load_cos_sin<false>(r, b, s, i, pair_c, pair_s);
          const std::int64_t ia = internal::rope_pair_first(r, i),
                             ib = internal::rope_pair_second(r, i);
          float a = to_float(row8.in[ia]), v = to_float(row8.in[ib]);
          detail::rotate_pair(a, v, pair_c[0], pair_s[0]);
          row8.out[ia] = internal::rope_float8_code(a, scale, r.out_dtype);
          row8.out[ib] = internal::rope_float8_code(v, scale, r.out_dtype);
        }
        for (std::int64_t e = r.rotary_dim + threadIdx.x; e < r.head_dim; e += blockDim.x) {
          row8.out[e] = internal::rope_float8_code(to_float(row8.in[e]), scale, r.out_dtype);
        }
        continue;
      }
      if (h >= q_heads + kv_heads) {
        // A v row: copied (converted) into the cache.
        if (!token.write) continue;
        const std::int64_t vh = h - q_heads - kv_heads;
        const T* in =
            static_cast<const T*>(p.v) + b * p.v_stride_b + s * p.v_stride_s + vh * p.v_stride_h;
        const std::int64_t out = cache_row(p.v_cache, token.slot.page, token.slot.offset, vh);
        for (std::int64_t e = threadIdx.x * kCopy; e < p.v_cache.head_dim;
             e += blockDim.x * kCopy) {
          Chunk<T, kCopy> x;
          load_elements<kVector>(in + e, x);
          store_to_cache<kVector>(p.v_cache, out + e, x);
        }
        continue;
      }
      // A q or k row: rotated into q's output, k_out and the k cache as the call asks.
      const bool is_k = h >= q_heads;
      const internal::RopeRow<T> row = internal::rope_row<T>(r, b, s, h);
      T* out = is_k && !k_written ? nullptr : row.out;
      const bool to_cache = is_k && token.write;
      const std::int64_t cache_out =
          to_cache ? cache_row(p.k_cache, token.slot.page, token.slot.offset, h - q_heads) : 0;
      if (token.bad_position) {
        if (out != nullptr) {
          for (std::int64_t e = threadIdx.x * kCopy; e < r.head_dim; e += blockDim.x * kCopy) {
            store_elements<kVector>(out + e, zero);
          }
        }
        continue;
      }
      if (out == nullptr && !to_cache) continue;
      for (std::int64_t chunk = threadIdx.x; chunk < rotary_chunks; chunk += blockDim.x) {
        if constexpr (!kVector) load_cos_sin<kVector>(r, b, s, chunk * kPairs, c, sn);
        Chunk<T, kVec> lo, hi;
        load_rotated<kLayout, kVector>(row.in, chunk * kVec, half, c, sn, lo, hi);
        store_rotated<kLayout>(chunk * kVec, half, lo, hi,
                               [&](std::int64_t at, const Chunk<T, kVec>& part) {
                                 if (out != nullptr) store_elements<kVector>(out + at, part);
                                 if (to_cache) {
                                   store_to_cache<kVector>(p.k_cache, cache_out + at, part);
                                 }
                               });
      }
      // Past rotary_dim: passed through to out (when not in place) and the cache.
      const bool copy_out = out != nullptr && out != row.in;
      if (!copy_out && !to_cache) continue;
      for (std::int64_t e = r.rotary_dim + threadIdx.x * kCopy; e < r.head_dim;
           e += blockDim.x * kCopy) {
        Chunk<T, kCopy> x;
        load_elements<kVector>(row.in + e, x);
        if (copy_out) store_elements<kVector>(out + e, x);
        if (to_cache) store_to_cache<kVector>(p.k_cache, cache_out + e, x);
      }
    }
  }
  if (last_block_done(r.bad)) describe_bad_token(p);
}

// The vector path needs a table of C (float32, or T's 16-bit dtype) aligned for
// load_cos_sin's vector loads, whole 16-byte chunks everywhere (rotary part, head dims of k
// and v, every pointer and stride of q, k, v and the outputs, and the caches' chunks of kVec
// elements aligned to their size), and at most 256 rotary chunks.
template <typename T, typename C>
bool fits_vector_path(const internal::RopeAppendKvParams& p) {
  constexpr std::int64_t vec = kVec16<T>;
  const internal::RopeParams& r = p.rope;
  const bool neox = r.layout == RopeLayout::neox;
  if (!table_fits_vector_loads<C>(r, neox ? vec : vec / 2)) return false;
  const std::int64_t chunks = neox ? r.rotary_dim / 2 / vec : r.rotary_dim / vec;
  if ((neox ? (r.rotary_dim / 2) % vec : r.rotary_dim % vec) != 0 || chunks > 256) return false;
  if (r.head_dim % vec != 0 || p.v_cache.head_dim % vec != 0) return false;
  auto strided = [&](const void* pointer, std::int64_t sb, std::int64_t ss, std::int64_t sh) {
    return is_aligned(pointer, 16) && sb % vec == 0 && ss % vec == 0 && sh % vec == 0;
  };
  if (!strided(r.q.in, r.q.in_stride_b, r.q.in_stride_s, r.q.in_stride_h) ||
      !strided(r.q.out, r.q.out_stride_b, r.q.out_stride_s, r.q.out_stride_h) ||
      !strided(r.k.in, r.k.in_stride_b, r.k.in_stride_s, r.k.in_stride_h) ||
      !strided(r.k.out, r.k.out_stride_b, r.k.out_stride_s, r.k.out_stride_h) ||
      !strided(p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h)) {
    return false;
  }
  for (const internal::KvCacheSide* c : {&p.k_cache, &p.v_cache}) {
    const std::size_t chunk_bytes = static_cast<std::size_t>(vec * dtype_size(c->dtype));
    if (!is_aligned(c->data, chunk_bytes) || c->stride_page % vec != 0 ||
        c->stride_offset % vec != 0 || c->stride_head % vec != 0) {
      return false;
    }
  }
  return true;
}

template <typename T, RopeLayout kLayout, bool kVector, typename C = float>
void launch(const internal::RopeAppendKvParams& p, cudaStream_t stream) {
  const internal::RopeParams& r = p.rope;
  constexpr std::int64_t vec = kVector ? kVec16<T> : (kLayout == RopeLayout::neox ? 1 : 2);
  const std::int64_t rows = r.q.heads + 2 * r.k.heads + r.q_nope.heads;
  // Threads along x: the rotary chunks (vector path), or a warp (general path).
  const std::int64_t chunks =
      kVector ? (kLayout == RopeLayout::neox ? r.rotary_dim / 2 : r.rotary_dim) / vec : 32;
  const RowsLaunch shape = rows_launch(r.batch * r.seq, rows, chunks);
  append_kv_kernel<T, kLayout, kVector, C>
      <<<shape.grid, shape.block, 0, stream>>>(p, shape.rows_per_split);
  check_launch("append_kv_kernel");
}

// The vector path with a float32 table, or one of T's 16-bit dtype; else the general path.
template <typename T>
void launch_for(const internal::RopeAppendKvParams& p, cudaStream_t stream) {
  const bool neox = p.rope.layout == RopeLayout::neox;
  const auto vector = [&](auto c) {
    using C = decltype(c);
    if (neox) return launch<T, RopeLayout::neox, true, C>(p, stream);
    return launch<T, RopeLayout::interleaved, true, C>(p, stream);
  };
  if (fits_vector_path<T, float>(p)) return vector(float{});
  if constexpr (!std::is_same_v<T, float>) {
    if (fits_vector_path<T, T>(p)) return vector(T{});
  }
  if (neox) return launch<T, RopeLayout::neox, false>(p, stream);
  launch<T, RopeLayout::interleaved, false>(p, stream);
}

}  // namespace

void apply_rope_append_kv(const internal::RopeAppendKvParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  internal::dispatch_value_dtype(
      p.rope.dtype, [&](auto t) { launch_for<typename decltype(t)::type>(p, to_cuda(stream)); });
}

}  // namespace embrope::gpu
