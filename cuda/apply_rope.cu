// RoPE on the GPU: Su et al. 2021 (RoFormer) rotation, pairs as in GPT-NeoX (rotate_half)
// or GPT-J (interleaved), the same detail::rotate_pair as the CPU path, through the
// RoPE-family building blocks of rope.cuh.
//
// Two kernels, one launch per call for q and k together (q heads, then k heads):
// - rope_vector_kernel, the fast path (after FlashInfer's pos_enc.cuh): 16-byte loads and
//   stores; threadIdx.x owns a chunk of rotation pairs (neox: VEC elements of each half;
//   interleaved: VEC consecutive elements), threadIdx.y a head; the chunk's cos/sin are
//   loaded once per token into registers and reused across the block's heads. Token-parallel
//   (each block loops over all heads of its tokens) when there are enough tokens to fill
//   the GPU, head-parallel (blocks split a token's heads) for decode-sized calls. The cos/sin
//   table is float32, or of the activations' own 16-bit dtype (vLLM's and SGLang's bfloat16
//   cos_sin_cache) for a rotary dim of 128 or the generic size and chunks of one stream.
// - rope_kernel, the general path (any rotary dim, unaligned pointers or strides, any other
//   cos/sin table): one warp per (token, head) row, scalar accesses.
// Each thread owns whole rotation pairs, so in place is race-free in both. Both are templated
// on the output element type O: T, or a float8 type for quantized outputs (RoPE + FP8 as
// FlashInfer's rope_quantize_fp8: value * scale rounded once, the non-rotary tensors q_nope and
// k_nope as rows after a token's rotated ones; the vector path then takes the generic rotary
// dim only, to keep the instantiations few).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "bad_index.cuh"
#include "common.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "rope.cuh"
#include "vector.cuh"

namespace embrope::gpu {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kWarpsPerBlock = 8;

// The general path's rows, into outputs of T (rope_kernel) or of a float8 O
// (rope_quantized_kernel).
template <typename T, typename C, typename O>
__device__ __forceinline__ void rope_rows(const internal::RopeParams& p) {
  constexpr bool kQuantized = !std::is_same_v<O, T>;
  const std::int64_t heads = internal::rope_rotated_heads(p);
  // Float8 outputs' non-rotary rows (q_nope's, k_nope's) follow a token's rotated rows.
  const std::int64_t all_heads = heads + (kQuantized ? internal::rope_nope_heads(p) : 0);
  const std::int64_t rows = p.batch * p.seq * all_heads;
  const std::int64_t half = p.rotary_dim / 2;
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const int lane = threadIdx.x;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.y;
       r < rows; r += warp_stride) {
    const std::int64_t t = r / all_heads;
    const std::int64_t h = r - t * all_heads;
    const std::int64_t b = t / p.seq;
    const std::int64_t s = t - b * p.seq;
    if (kQuantized && h >= heads) {
      const internal::RopeNopeRow<T, O> nope = internal::rope_nope_row<T, O>(p, b, s, h - heads);
      const bool bad = internal::rope_bad_stream(p, b, s) >= 0;
      const float scale = internal::rope_out_scale(p, nope.head);
      for (std::int64_t j = lane; j < nope.dim; j += 32) {
        nope.out[j] = bad ? from_float<O>(0.0f)
                          : internal::rope_output_value<T, O>(to_float(nope.in[j]), scale);
      }
      continue;
    }
    const internal::RopeRow<T, O> row = internal::rope_row<T, O>(p, b, s, h);
    const T* in = row.in;
    O* out = row.out;
    if (internal::rope_bad_stream(p, b, s) >= 0) {
      for (std::int64_t j = lane; j < p.head_dim; j += 32) out[j] = from_float<O>(0.0f);
      if (lane == 0)
        report_bad_row(p.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
      continue;
    }
    const float scale = kQuantized ? internal::rope_out_scale(p, h) : 1.0f;
    // With several streams each pair's position is read where it is used, as load_cos_sin's
    // by_pair does: holding the token's four stream positions across the loop made ptxas
    // spill. With one, the token's position is read once.
    const std::int64_t position = internal::rope_position(p, b, s, 0);
    for (std::int64_t i = lane; i < half; i += 32) {
      const std::int64_t ia = internal::rope_pair_first(p, i);
      const std::int64_t ib = internal::rope_pair_second(p, i);
      const std::int64_t row =
          p.mrope ? internal::rope_position(p, b, s, internal::rope_stream(p, i)) : position;
      const float c = to_float(static_cast<const C*>(p.cos)[row * p.cos_stride + i]);
      const float sn = sin_sign * to_float(static_cast<const C*>(p.sin)[row * p.sin_stride + i]);
      float a = to_float(in[ia]);
      float v = to_float(in[ib]);
      detail::rotate_pair(a, v, c, sn);
      out[ia] = internal::rope_output_value<T, O>(a, scale);
      out[ib] = internal::rope_output_value<T, O>(v, scale);
    }
    if constexpr (kQuantized) {
      for (std::int64_t j = p.rotary_dim + lane; j < p.head_dim; j += 32) {
        out[j] = internal::rope_output_value<T, O>(to_float(in[j]), scale);
      }
    } else if (out != in) {
      for (std::int64_t j = p.rotary_dim + lane; j < p.head_dim; j += 32) out[j] = in[j];
    }
  }
  if (last_block_done(p.bad)) describe_bad_rope_position(p);
}

template <typename T, typename C>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    rope_kernel(const __grid_constant__ internal::RopeParams p) {
  rope_rows<T, C, T>(p);
}

// (256, 1), as append_kv_kernel: with the bound alone ptxas spilled 4 bytes around the two
// float8 conversions of a pair in the float16 instantiations.
template <typename T, typename C, typename O>
__global__ void __launch_bounds__(32 * kWarpsPerBlock, 1)
    rope_quantized_kernel(const __grid_constant__ internal::RopeParams p) {
  rope_rows<T, C, O>(p);
}

template <typename T, typename C, typename O>
void launch(const internal::RopeParams& p, cudaStream_t stream) {
  const std::int64_t rows =
      p.batch * p.seq *
      (internal::rope_rotated_heads(p) + (std::is_same_v<O, T> ? 0 : internal::rope_nope_heads(p)));
  const dim3 block(32, kWarpsPerBlock);
  if constexpr (std::is_same_v<O, T>) {
    rope_kernel<T, C><<<grid_for(rows, kWarpsPerBlock, 32 * kWarpsPerBlock), block, 0, stream>>>(p);
    check_launch("rope_kernel");
  } else {
    rope_quantized_kernel<T, C, O>
        <<<grid_for(rows, kWarpsPerBlock, 32 * kWarpsPerBlock), block, 0, stream>>>(p);
    check_launch("rope_quantized_kernel");
  }
}

// ---------------------------------------------------------------- fast path ----

// kRotaryDim: the rotary dim as a compile-time constant for the common head sizes (address
// arithmetic and loop bounds fold), or 0 for any other size (read from the parameters).
// kMixedStreams: some chunk's pairs take their angles from different mrope streams
// (load_cos_sin then reads those pair by pair); only with kRotaryDim 0, and launched only
// when needed, since that fallback more than doubles the kernel's registers. C: the cos/sin
// table's element type (float, or T).
template <typename T, typename O, typename C, RopeLayout kLayout, int kRotaryDim,
          bool kMixedStreams>
__global__ void __launch_bounds__(256)
    rope_vector_kernel(const __grid_constant__ internal::RopeParams p,
                       std::int64_t heads_per_block) {
  constexpr bool kQuantized = !std::is_same_v<O, T>;
  constexpr int kVec = kVec16<T>;
  using V = Chunk<T, kVec>;
  using VOut = Chunk<O, kVec>;
  constexpr int kPairs = kChunkPairs<kLayout, kVec>;
  const std::int64_t tokens = p.batch * p.seq;
  const std::int64_t heads = internal::rope_rotated_heads(p);
  // Float8 outputs' non-rotary rows (q_nope's, k_nope's) follow a token's rotated rows.
  const std::int64_t all_heads = heads + (kQuantized ? internal::rope_nope_heads(p) : 0);
  const std::int64_t rotary_dim = kRotaryDim != 0 ? kRotaryDim : p.rotary_dim;
  const std::int64_t half = rotary_dim / 2;
  const std::int64_t head_begin = blockIdx.y * heads_per_block;
  const std::int64_t head_end = min(all_heads, head_begin + heads_per_block);
  const int chunk = threadIdx.x;            // blockDim.x == number of chunks of the rotary part
  const std::int64_t first = chunk * kVec;  // first element of the chunk (of each half for neox)
  const std::int64_t pair0 = chunk * kPairs;
  const std::int64_t tail_chunks = (p.head_dim - rotary_dim) / kVec;

  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t b = t / p.seq;
    const std::int64_t s = t - b * p.seq;
    const bool bad = internal::rope_bad_stream(p, b, s) >= 0;
    float c[kPairs], sn[kPairs];
    if (!bad) {
      load_cos_sin<true, kMixedStreams, C>(p, b, s, pair0, c, sn);
    } else if (threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.y == 0) {
      report_bad_row(p.bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
    }
    for (std::int64_t h = head_begin + threadIdx.y; h < head_end; h += blockDim.y) {
      if (kQuantized && h >= heads) {  // a non-rotary row: quantized chunk by chunk
        const internal::RopeNopeRow<T, O> nope = internal::rope_nope_row<T, O>(p, b, s, h - heads);
        const float scale = internal::rope_out_scale(p, nope.head);
        for (std::int64_t e = chunk; e < nope.dim / kVec; e += blockDim.x) {
          VOut x;
          if (bad) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) x.v[j] = from_float<O>(0.0f);
          } else {
            x = output_chunk<O>(*reinterpret_cast<const V*>(nope.in + e * kVec), scale);
          }
          *reinterpret_cast<VOut*>(nope.out + e * kVec) = x;
        }
        continue;
      }
      const internal::RopeRow<T, O> row = internal::rope_row<T, O>(p, b, s, h);
      const T* in = row.in;
      O* out = row.out;
      if (bad) {
        VOut zero;
#pragma unroll
        for (int j = 0; j < kVec; ++j) zero.v[j] = from_float<O>(0.0f);
        for (std::int64_t e = chunk * kVec; e < p.head_dim; e += blockDim.x * kVec) {
          *reinterpret_cast<VOut*>(out + e) = zero;
        }
        continue;
      }
      const float scale = kQuantized ? internal::rope_out_scale(p, h) : 1.0f;
      VOut lo, hi;
      load_rotated<kLayout, true>(in, first, half, c, sn, lo, hi, scale);
      store_rotated<kLayout>(first, half, lo, hi, [&](std::int64_t at, const VOut& part) {
        store_elements<true>(out + at, part);
      });
      bool pass_through = true;  // the elements past rotary_dim, unless in place
      if constexpr (!kQuantized) pass_through = out != in;
      if (pass_through) {
        for (std::int64_t e = chunk; e < tail_chunks; e += blockDim.x) {
          const std::int64_t at = rotary_dim + e * kVec;
          *reinterpret_cast<VOut*>(out + at) =
              output_chunk<O>(*reinterpret_cast<const V*>(in + at), scale);
        }
      }
    }
  }
  if (last_block_done(p.bad)) describe_bad_rope_position(p);
}

// The fast path needs: a table of C (float32; or T's 16-bit dtype, T's own outputs) aligned
// for load_cos_sin's vector loads, whole 16-byte chunks everywhere (rotary part, pass-through
// part, every pointer and stride; a float8 output's chunks aligned to their size), and at
// most 256 threads per head row.
template <typename T, typename O, typename C>
bool fits_vector_path(const internal::RopeParams& p) {
  constexpr std::int64_t vec = kVec16<T>;
  const bool neox = p.layout == RopeLayout::neox;
  if (!table_fits_vector_loads<C>(p, neox ? vec : vec / 2)) return false;
  if (neox ? (p.rotary_dim / 2) % vec != 0 : p.rotary_dim % vec != 0) return false;
  if (p.head_dim % vec != 0) return false;
  const std::int64_t chunks = neox ? p.rotary_dim / 2 / vec : p.rotary_dim / vec;
  if (chunks > 256) return false;
  auto heads_ok = [&](const internal::RopeHeads& x) {
    return is_aligned(x.in, 16) && is_aligned(x.out, vec * sizeof(O)) && x.in_stride_b % vec == 0 &&
           x.in_stride_s % vec == 0 && x.in_stride_h % vec == 0 && x.out_stride_b % vec == 0 &&
           x.out_stride_s % vec == 0 && x.out_stride_h % vec == 0;
  };
  if (!heads_ok(p.q) || (p.has_k && !heads_ok(p.k))) return false;
  return (p.q_nope.heads == 0 || (heads_ok(p.q_nope) && p.q_nope_dim % vec == 0)) &&
         (p.k_nope.heads == 0 || (heads_ok(p.k_nope) && p.k_nope_dim % vec == 0));
}

template <typename T, typename O, typename C, RopeLayout kLayout>
void launch_vector(const internal::RopeParams& p, cudaStream_t stream) {
  constexpr std::int64_t vec = kVec16<T>;
  const std::int64_t chunks =
      kLayout == RopeLayout::neox ? p.rotary_dim / 2 / vec : p.rotary_dim / vec;
  const std::int64_t heads =
      internal::rope_rotated_heads(p) + (std::is_same_v<O, T> ? 0 : internal::rope_nope_heads(p));
  // A block per token loads the token's cos/sin once for all its heads; decode splits them.
  const RowsLaunch shape = rows_launch(p.batch * p.seq, heads, chunks);
  const dim3 grid = shape.grid, block = shape.block;
  const std::int64_t heads_per_block = shape.rows_per_split;
  // Templated on the common rotary dims (full rotary of heads of 64, 80, 96, 128 and 256, and
  // the partial 32 of GPT-NeoX/Pythia and 64 of GPT-J); any other size, float8 outputs and
  // chunks that straddle mrope streams take the generic one. A 16-bit table: 128 (Llama,
  // Qwen, Mistral heads) or the generic size, its chunks of one stream (launch_for_table).
  const auto kernel = [&](auto rotary_dim, auto mixed_streams) {
    rope_vector_kernel<T, O, C, kLayout, decltype(rotary_dim)::value,
                       decltype(mixed_streams)::value>
        <<<grid, block, 0, stream>>>(p, heads_per_block);
  };
  using Mixed = std::true_type;
  using OneStream = std::false_type;
  if constexpr (std::is_same_v<C, float>) {
    if (!chunks_share_stream(p, kChunkPairs<kLayout, kVec16<T>>)) {
      kernel(std::integral_constant<int, 0>{}, Mixed{});
      return check_launch("rope_vector_kernel");
    }
  }
  if constexpr (!std::is_same_v<O, T>) {
    kernel(std::integral_constant<int, 0>{}, OneStream{});
  } else if constexpr (!std::is_same_v<C, float>) {
    if (p.rotary_dim == 128) {
      kernel(std::integral_constant<int, 128>{}, OneStream{});
    } else {
      kernel(std::integral_constant<int, 0>{}, OneStream{});
    }
  } else {
    switch (p.rotary_dim) {
      case 32:
        kernel(std::integral_constant<int, 32>{}, OneStream{});
        break;
      case 64:
        kernel(std::integral_constant<int, 64>{}, OneStream{});
        break;
      case 80:
        kernel(std::integral_constant<int, 80>{}, OneStream{});
        break;
      case 96:
        kernel(std::integral_constant<int, 96>{}, OneStream{});
        break;
      case 128:
        kernel(std::integral_constant<int, 128>{}, OneStream{});
        break;
      case 256:
        kernel(std::integral_constant<int, 256>{}, OneStream{});
        break;
      default:
        kernel(std::integral_constant<int, 0>{}, OneStream{});
    }
  }
  check_launch("rope_vector_kernel");
}

// The fast path for a float32 table; for a table of T's own 16-bit dtype into T when its
// chunks share one stream (a chunk straddling mrope streams reads pair by pair, which the
// general path does anyway); else the general path.
template <typename T, typename O>
void launch_for_table(const internal::RopeParams& p, cudaStream_t stream) {
  const auto vector = [&](auto c) {
    using C = decltype(c);
    if (p.layout == RopeLayout::neox) return launch_vector<T, O, C, RopeLayout::neox>(p, stream);
    return launch_vector<T, O, C, RopeLayout::interleaved>(p, stream);
  };
  if (fits_vector_path<T, O, float>(p)) return vector(float{});
  if constexpr (std::is_same_v<O, T> && !std::is_same_v<T, float>) {
    const bool one_stream =
        p.layout == RopeLayout::neox
            ? chunks_share_stream(p, kChunkPairs<RopeLayout::neox, kVec16<T>>)
            : chunks_share_stream(p, kChunkPairs<RopeLayout::interleaved, kVec16<T>>);
    if (fits_vector_path<T, O, T>(p) && one_stream) return vector(T{});
  }
  internal::dispatch_value_dtype(
      p.table_dtype, [&](auto c) { launch<T, typename decltype(c)::type, O>(p, stream); });
}

}  // namespace

void apply_rope(const internal::RopeParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  internal::dispatch_value_dtype(p.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if (!internal::rope_quantized(p)) return launch_for_table<T, T>(p, to_cuda(stream));
    internal::dispatch_float8_dtype(p.out_dtype, [&](auto o) {
      launch_for_table<T, typename decltype(o)::type>(p, to_cuda(stream));
    });
  });
}

}  // namespace embrope::gpu
