// The building blocks of the RoPE-family kernels (apply_rope.cu, apply_rope_append_kv.cu,
// apply_qk_norm_rope.cu), in one place, after FlashInfer's pos_enc.cuh device helpers:
// - load_cos_sin: a chunk's cos and sin, from the token's stream positions;
// - load_rotated / store_rotated: a chunk of a head row read, rotated in registers by
//   detail::rotate_pair (Su et al. 2021, RoFormer), and handed back part by part for the
//   caller's stores (an output, a KV cache);
// - rows_launch: the block and grid of a kernel over (token, head row) pairs.
// The scalar kernels take single pairs through internal::rope_pair_first / rope_pair_second /
// rope_pair_cos_sin (src/apply_rope_params.hpp), which the CPU backend uses too.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../src/apply_rope_params.hpp"
#include "../src/dispatch.hpp"
#include "common.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "vector.cuh"

namespace embrope::gpu {

// cos and sin (sin negated for inverse) of the kPairs pairs from pair0 of token (b, s).
// kVector: the table is of C (float32, or the 16-bit activations' own dtype, as vLLM's and
// SGLang's cos_sin_cache) with every chunk's row aligned (the vector paths' condition), read
// with one vector load each when the chunk's pairs share one stream (always without mrope);
// otherwise pair by pair, from a table of any value dtype, each pair's stream
// position read where it is used (holding the three stream positions in registers across
// the unrolled pairs, as the scalar kernels do, made ptxas spill the float16 neox chunk).
// kMixedStreams = false: the launcher has checked that every chunk shares one stream
// (chunks_share_stream), and the pair-by-pair fallback is left out of the kernel. It costs
// registers even where it never runs: bfloat16 neox rope_vector_kernel took 122 registers with
// it and 48 without, which on an H100 is 3 resident blocks of 160 threads per SM against 8.
template <bool kVector, bool kMixedStreams = true, typename C = float, int kPairs>
__device__ __forceinline__ void load_cos_sin(const internal::RopeParams& r, std::int64_t b,
                                             std::int64_t s, std::int64_t pair0, float (&c)[kPairs],
                                             float (&sn)[kPairs]) {
  const auto by_pair = [&] {
    // The pairs' streams packed two bits each into one register (the same for every token of
    // a thread, so ptxas keeps it across the token loop: the per-pair arithmetic of the
    // interleaved streams, hoisted instead, spilled), and the token's offset into positions.
    static_assert(2 * kPairs <= 32 && detail::kMaxPositionStreams <= 4);
    std::uint32_t streams = 0;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      streams |= static_cast<std::uint32_t>(internal::rope_stream(r, pair0 + j)) << (2 * j);
    }
    const std::int64_t token = b * r.position_stride_b + s * r.position_stride_s;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const std::int64_t stream = (streams >> (2 * j)) & 3u;
      const std::int64_t row = internal::load_index(r.positions, r.position_dtype,
                                                    stream * r.position_stride_stream + token);
      if constexpr (kVector) {
        c[j] = detail::to_float(static_cast<const C*>(r.cos)[row * r.cos_stride + pair0 + j]);
        sn[j] = detail::to_float(static_cast<const C*>(r.sin)[row * r.sin_stride + pair0 + j]);
      } else {
        c[j] = internal::load_vector_value(r.cos, r.table_dtype, row * r.cos_stride + pair0 + j);
        sn[j] = internal::load_vector_value(r.sin, r.table_dtype, row * r.sin_stride + pair0 + j);
      }
    }
  };
  if constexpr (kVector) {
    const int stream = internal::rope_chunk_stream(r, pair0, kPairs);
    if (!kMixedStreams || stream >= 0) {
      // (Without kMixedStreams stream is never -1; reading stream 0 then keeps a broken
      // launcher check in bounds.)
      const std::int64_t row = internal::rope_position(r, b, s, stream < 0 ? 0 : stream);
      if constexpr (std::is_same_v<C, float>) {
        load_floats<kPairs>(static_cast<const float*>(r.cos) + row * r.cos_stride + pair0, c);
        load_floats<kPairs>(static_cast<const float*>(r.sin) + row * r.sin_stride + pair0, sn);
      } else {  // kPairs values of C: one 8- or 16-byte load each
        load_chunk<C, kPairs>(static_cast<const C*>(r.cos) + row * r.cos_stride + pair0, c);
        load_chunk<C, kPairs>(static_cast<const C*>(r.sin) + row * r.sin_stride + pair0, sn);
      }
    } else if constexpr (kMixedStreams) {
      by_pair();
    }
  } else {
    by_pair();
  }
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) sn[j] *= sin_sign;
}

// Pairs per chunk of kVec elements: neox chunks hold kVec elements of each half (kVec
// pairs), interleaved ones kVec consecutive elements (kVec / 2 pairs).
template <RopeLayout kLayout, int kVec>
constexpr int kChunkPairs = kLayout == RopeLayout::neox ? kVec : kVec / 2;

// Whether load_cos_sin's vector loads (kVector) fit the call's table for chunks of `pairs`
// pairs: a table of C whose chunks, in every row, are aligned to the loads (float32: float4s,
// or one float2 for 2 pairs; a 16-bit C: one chunk of 8 or 16 bytes).
template <typename C>
bool table_fits_vector_loads(const internal::RopeParams& r, std::int64_t pairs) {
  if (r.table_dtype != internal::value_dtype<C>()) return false;
  const std::int64_t align =
      std::min<std::int64_t>(16, pairs * static_cast<std::int64_t>(sizeof(C)));
  const std::int64_t step = align / static_cast<std::int64_t>(sizeof(C));  // values per load
  return is_aligned(r.cos, static_cast<std::size_t>(align)) &&
         is_aligned(r.sin, static_cast<std::size_t>(align)) && r.cos_stride % step == 0 &&
         r.sin_stride % step == 0;
}

// Whether every chunk of `pairs_per_chunk` pairs takes its angles from one position stream:
// always without mrope; with mrope when no chunk straddles a section (Qwen2-VL's 16/24/24
// sections in chunks of 8 or fewer pairs), never with interleaved streams (Qwen3-VL).
inline bool chunks_share_stream(const internal::RopeParams& p, std::int64_t pairs_per_chunk) {
  if (!p.mrope) return true;
  for (std::int64_t i = 0; i < p.rotary_dim / 2; i += pairs_per_chunk) {
    if (internal::rope_chunk_stream(p, i, pairs_per_chunk) < 0) return false;
  }
  return true;
}

// The chunk at element `first` of row `in`, rotated: neox reads kVec elements at first and
// at first + half (lo, hi), interleaved kVec elements at first (lo; hi unused). kVector: one
// aligned 16-byte access per part; otherwise element by element. The parts are Chunks (as
// the vector loads and stores are): with plain arrays of 16-bit values ptxas kept the
// float16 neox chunks in local memory.
// The parts are of the output's element type O: T (rounded once, `scale` unused), or a float8
// type for quantized outputs (scaled, then rounded once: internal::rope_output_value).
template <RopeLayout kLayout, bool kVector, typename T, typename O, int kVec, int kPairs>
__device__ __forceinline__ void load_rotated(const T* in, std::int64_t first, std::int64_t half,
                                             const float (&c)[kPairs], const float (&sn)[kPairs],
                                             Chunk<O, kVec>& lo, Chunk<O, kVec>& hi,
                                             float scale = 1.0f) {
  static_assert(kPairs == kChunkPairs<kLayout, kVec>, "cos/sin entries: one per pair");
  using detail::to_float;
  using internal::rope_output_value;
  Chunk<T, kVec> x_lo, x_hi;
  load_elements<kVector>(in + first, x_lo);
  if constexpr (kLayout == RopeLayout::neox) {
    load_elements<kVector>(in + first + half, x_hi);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float a = to_float(x_lo.v[j]), v = to_float(x_hi.v[j]);
      detail::rotate_pair(a, v, c[j], sn[j]);
      lo.v[j] = rope_output_value<T, O>(a, scale);
      hi.v[j] = rope_output_value<T, O>(v, scale);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      float a = to_float(x_lo.v[2 * j]), v = to_float(x_lo.v[2 * j + 1]);
      detail::rotate_pair(a, v, c[j], sn[j]);
      lo.v[2 * j] = rope_output_value<T, O>(a, scale);
      lo.v[2 * j + 1] = rope_output_value<T, O>(v, scale);
    }
  }
}

// Pass-through elements as the output's type O: unchanged (O = T), or scaled and rounded once
// to float8.
template <typename O, typename T, int W>
__device__ __forceinline__ Chunk<O, W> output_chunk(const Chunk<T, W>& x, float scale) {
  if constexpr (std::is_same_v<O, T>) {
    return x;
  } else {
    Chunk<O, W> y;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      y.v[w] = internal::rope_output_value<T, O>(detail::to_float(x.v[w]), scale);
    }
    return y;
  }
}

// Hands a rotated chunk to store(at, part) part by part: the element offset in the row each
// part belongs at (first; first + half for neox's hi).
template <RopeLayout kLayout, typename O, int kVec, typename Store>
__device__ __forceinline__ void store_rotated(std::int64_t first, std::int64_t half,
                                              const Chunk<O, kVec>& lo, const Chunk<O, kVec>& hi,
                                              Store&& store) {
  store(first, lo);
  if constexpr (kLayout == RopeLayout::neox) store(first + half, hi);
}

// The launch of a kernel over the (token, row) pairs of a call, `threads_x` threads per row
// (its chunks, or a warp): rows per block spread evenly over the passes a block makes (at
// most 256 threads: 40 rows of 8 threads make 2 passes of 20, not 32 then 8); one block per
// token (grid x) when there are enough tokens to give every multiprocessor a few blocks,
// otherwise each token's rows split over blocks (grid y, rows_per_split each) so that
// decode-sized calls still spread over the GPU; a grid of at most kGridWaves times what the
// device holds at once, the blocks walking the tokens past it.
struct RowsLaunch {
  dim3 grid, block;
  std::int64_t rows_per_split;
};
inline RowsLaunch rows_launch(std::int64_t tokens, std::int64_t rows, std::int64_t threads_x) {
  const std::int64_t max_rows = std::max<std::int64_t>(1, 256 / threads_x);
  const std::int64_t passes = (rows + max_rows - 1) / max_rows;
  const std::int64_t rows_per_block = std::max<std::int64_t>(1, (rows + passes - 1) / passes);
  const std::int64_t blocks_wanted = 4LL * multiprocessor_count();
  std::int64_t rows_per_split = rows;
  if (tokens < blocks_wanted) {
    const std::int64_t splits = std::min((rows + rows_per_block - 1) / rows_per_block,
                                         (blocks_wanted + tokens - 1) / tokens);
    rows_per_split = (rows + splits - 1) / splits;
  }
  RowsLaunch launch;
  launch.block = dim3(static_cast<unsigned>(threads_x), static_cast<unsigned>(rows_per_block));
  // Tokens past the grid are walked by its blocks (grid_for says why the grid is capped).
  const std::int64_t max_blocks =
      kGridWaves * multiprocessor_count() * blocks_per_multiprocessor(threads_x * rows_per_block);
  launch.grid = dim3(static_cast<unsigned>(std::min(tokens, max_blocks)),
                     static_cast<unsigned>((rows + rows_per_split - 1) / rows_per_split));
  launch.rows_per_split = rows_per_split;
  return launch;
}

}  // namespace embrope::gpu
