// RoPE on the GPU: Su et al. 2021 (RoFormer) rotation, pairs as in GPT-NeoX (rotate_half)
// or GPT-J (interleaved), the same detail::rotate_pair as the CPU path.
//
// Two kernels, one launch per call for q and k together (q heads, then k heads):
// - rope_vector_kernel, the fast path (after FlashInfer's pos_enc.cuh): 16-byte loads and
//   stores; threadIdx.x owns a chunk of rotation pairs (neox: VEC elements of each half;
//   interleaved: VEC consecutive elements), threadIdx.y a head; the chunk's cos/sin are
//   loaded once per token into registers and reused across the block's heads. Token-parallel
//   (each block loops over all heads of its tokens) when there are enough tokens to fill
//   the GPU, head-parallel (blocks split a token's heads) for decode-sized calls.
// - rope_kernel, the general path (any rotary dim, unaligned pointers or strides, a
//   float16/bfloat16 cos/sin table): one warp per (token, head) row, scalar accesses.
// Each thread owns whole rotation pairs, so in place is race-free in both.
#include <algorithm>
#include <cstdint>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "bad_index.cuh"
#include "common.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "vector.cuh"

namespace embrope::gpu {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kWarpsPerBlock = 8;

template <typename T, typename C>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    rope_kernel(const __grid_constant__ detail::RopeParams p) {
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const std::int64_t rows = p.batch * p.seq * heads;
  const std::int64_t half = p.rotary_dim / 2;
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const int lane = threadIdx.x;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.y;
       r < rows; r += warp_stride) {
    const std::int64_t t = r / heads;
    const std::int64_t h = r - t * heads;
    const std::int64_t b = t / p.seq;
    const std::int64_t s = t - b * p.seq;
    const detail::RopeRow<T> row = detail::rope_row<T>(p, b, s, h);
    const T* in = row.in;
    T* out = row.out;
    if (detail::rope_bad_stream(p, b, s) >= 0) {
      for (std::int64_t j = lane; j < p.head_dim; j += 32) out[j] = from_float<T>(0.0f);
      if (lane == 0)
        report_bad_row(p.bad, detail::bad_index_key(t, detail::BadIndexArg::positions));
      continue;
    }
    // Stream positions (mrope: temporal, height, width; otherwise one). Three scalars picked
    // by selects, not an array indexed at run time, which would live in local memory.
    const std::int64_t position0 = detail::rope_position(p, b, s, 0);
    const std::int64_t position1 = p.mrope ? detail::rope_position(p, b, s, 1) : position0;
    const std::int64_t position2 = p.mrope ? detail::rope_position(p, b, s, 2) : position0;
    for (std::int64_t i = lane; i < half; i += 32) {
      const int stream = detail::rope_stream(p, i);
      const std::int64_t table_row =
          stream == 0 ? position0 : (stream == 1 ? position1 : position2);
      const C* cos_row = static_cast<const C*>(p.cos) + table_row * p.cos_stride;
      const C* sin_row = static_cast<const C*>(p.sin) + table_row * p.sin_stride;
      const std::int64_t ia = p.layout == RopeLayout::neox ? i : 2 * i;
      const std::int64_t ib = p.layout == RopeLayout::neox ? i + half : 2 * i + 1;
      float a = to_float(in[ia]);
      float v = to_float(in[ib]);
      detail::rotate_pair(a, v, to_float(cos_row[i]), sin_sign * to_float(sin_row[i]));
      out[ia] = from_float<T>(a);
      out[ib] = from_float<T>(v);
    }
    if (out != in) {
      for (std::int64_t j = p.rotary_dim + lane; j < p.head_dim; j += 32) out[j] = in[j];
    }
  }
  if (last_block_done(p.bad)) describe_bad_rope_position(p);
}

template <typename T, typename C>
void launch(const detail::RopeParams& p, cudaStream_t stream) {
  const std::int64_t rows = p.batch * p.seq * (p.q.heads + (p.has_k ? p.k.heads : 0));
  const dim3 block(32, kWarpsPerBlock);
  rope_kernel<T, C><<<grid_for(rows, kWarpsPerBlock), block, 0, stream>>>(p);
  check_launch("rope_kernel");
}

// ---------------------------------------------------------------- fast path ----

// kRotaryDim: the rotary dim as a compile-time constant for the common head sizes (address
// arithmetic and loop bounds fold), or 0 for any other size (read from the parameters).
template <typename T, RopeLayout kLayout, int kRotaryDim>
__global__ void __launch_bounds__(256)
    rope_vector_kernel(const __grid_constant__ detail::RopeParams p, std::int64_t heads_per_block) {
  constexpr int kVec = kVec16<T>;
  using V = Chunk<T, kVec>;
  // Floats of cos (and of sin) a chunk needs: one per pair it holds.
  constexpr int kPairs = kLayout == RopeLayout::neox ? kVec : kVec / 2;
  const std::int64_t tokens = p.batch * p.seq;
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const std::int64_t rotary_dim = kRotaryDim != 0 ? kRotaryDim : p.rotary_dim;
  const std::int64_t half = rotary_dim / 2;
  const std::int64_t head_begin = blockIdx.y * heads_per_block;
  const std::int64_t head_end = min(heads, head_begin + heads_per_block);
  const int chunk = threadIdx.x;            // blockDim.x == number of chunks of the rotary part
  const std::int64_t first = chunk * kVec;  // first element of the chunk (of each half for neox)
  const std::int64_t pair0 = kLayout == RopeLayout::neox ? chunk * kVec : chunk * (kVec / 2);
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const std::int64_t tail_chunks = (p.head_dim - rotary_dim) / kVec;

  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int64_t b = t / p.seq;
    const std::int64_t s = t - b * p.seq;
    const bool bad = detail::rope_bad_stream(p, b, s) >= 0;
    float c[kPairs], sn[kPairs];
    if (!bad) {
      const auto* cos_table = static_cast<const float*>(p.cos);
      const auto* sin_table = static_cast<const float*>(p.sin);
      const int chunk_stream = detail::rope_chunk_stream(p, pair0, kPairs);
      if (chunk_stream >= 0) {
        // The chunk's pairs share one position (always, without mrope): vector loads.
        const std::int64_t position = detail::rope_position(p, b, s, chunk_stream);
        load_floats<kPairs>(cos_table + position * p.cos_stride + pair0, c);
        load_floats<kPairs>(sin_table + position * p.sin_stride + pair0, sn);
      } else {
        // mrope, a chunk straddling a section boundary or interleaved: per-pair rows.
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const std::int64_t position =
              detail::rope_position(p, b, s, detail::rope_stream(p, pair0 + j));
          c[j] = cos_table[position * p.cos_stride + pair0 + j];
          sn[j] = sin_table[position * p.sin_stride + pair0 + j];
        }
      }
#pragma unroll
      for (int j = 0; j < kPairs; ++j) sn[j] *= sin_sign;
    } else if (threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.y == 0) {
      report_bad_row(p.bad, detail::bad_index_key(t, detail::BadIndexArg::positions));
    }
    for (std::int64_t h = head_begin + threadIdx.y; h < head_end; h += blockDim.y) {
      const detail::RopeRow<T> row = detail::rope_row<T>(p, b, s, h);
      const T* in = row.in;
      T* out = row.out;
      if (bad) {
        V zero;
#pragma unroll
        for (int j = 0; j < kVec; ++j) zero.v[j] = from_float<T>(0.0f);
        for (std::int64_t e = chunk * kVec; e < p.head_dim; e += blockDim.x * kVec) {
          *reinterpret_cast<V*>(out + e) = zero;
        }
        continue;
      }
      if constexpr (kLayout == RopeLayout::neox) {
        V lo = *reinterpret_cast<const V*>(in + first);
        V hi = *reinterpret_cast<const V*>(in + first + half);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float a = to_float(lo.v[j]);
          float v = to_float(hi.v[j]);
          detail::rotate_pair(a, v, c[j], sn[j]);
          lo.v[j] = from_float<T>(a);
          hi.v[j] = from_float<T>(v);
        }
        *reinterpret_cast<V*>(out + first) = lo;
        *reinterpret_cast<V*>(out + first + half) = hi;
      } else {
        V xv = *reinterpret_cast<const V*>(in + first);
#pragma unroll
        for (int j = 0; j < kVec / 2; ++j) {
          float a = to_float(xv.v[2 * j]);
          float v = to_float(xv.v[2 * j + 1]);
          detail::rotate_pair(a, v, c[j], sn[j]);
          xv.v[2 * j] = from_float<T>(a);
          xv.v[2 * j + 1] = from_float<T>(v);
        }
        *reinterpret_cast<V*>(out + first) = xv;
      }
      if (out != in) {
        for (std::int64_t e = chunk; e < tail_chunks; e += blockDim.x) {
          const std::int64_t at = rotary_dim + e * kVec;
          *reinterpret_cast<V*>(out + at) = *reinterpret_cast<const V*>(in + at);
        }
      }
    }
  }
  if (last_block_done(p.bad)) describe_bad_rope_position(p);
}

// The fast path needs: a float32 table, whole 16-byte chunks everywhere (rotary part,
// pass-through part, every pointer and stride), and at most 256 threads per head row.
template <typename T>
bool fits_vector_path(const detail::RopeParams& p) {
  constexpr std::int64_t vec = kVec16<T>;
  if (p.table_dtype != DType::float32) return false;
  const bool neox = p.layout == RopeLayout::neox;
  if (neox ? (p.rotary_dim / 2) % vec != 0 : p.rotary_dim % vec != 0) return false;
  if (p.head_dim % vec != 0) return false;
  const std::int64_t chunks = neox ? p.rotary_dim / 2 / vec : p.rotary_dim / vec;
  if (chunks > 256) return false;
  auto heads_ok = [&](const detail::RopeHeads& x) {
    return is_aligned(x.in, 16) && is_aligned(x.out, 16) && x.in_stride_b % vec == 0 &&
           x.in_stride_s % vec == 0 && x.in_stride_h % vec == 0 && x.out_stride_b % vec == 0 &&
           x.out_stride_s % vec == 0 && x.out_stride_h % vec == 0;
  };
  if (!heads_ok(p.q) || (p.has_k && !heads_ok(p.k))) return false;
  const std::int64_t pairs = neox ? vec : vec / 2;  // floats of cos per chunk
  const std::size_t table_align = static_cast<std::size_t>(pairs >= 4 ? 16 : 4 * pairs);
  return is_aligned(p.cos, table_align) && is_aligned(p.sin, table_align) &&
         p.cos_stride % (pairs >= 4 ? 4 : pairs) == 0 &&
         p.sin_stride % (pairs >= 4 ? 4 : pairs) == 0;
}

template <typename T, RopeLayout kLayout>
void launch_vector(const detail::RopeParams& p, cudaStream_t stream) {
  constexpr std::int64_t vec = kVec16<T>;
  const std::int64_t chunks =
      kLayout == RopeLayout::neox ? p.rotary_dim / 2 / vec : p.rotary_dim / vec;
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const std::int64_t tokens = p.batch * p.seq;
  // Head rows per block: at most 256 threads, and the heads spread evenly over the passes a
  // block makes (40 heads of 8 chunks: 2 passes of 20 rows, not 32 rows then 8).
  const std::int64_t max_rows = std::max<std::int64_t>(1, 256 / chunks);
  const std::int64_t passes = (heads + max_rows - 1) / max_rows;
  const std::int64_t rows_per_block = std::max<std::int64_t>(1, (heads + passes - 1) / passes);
  const dim3 block(static_cast<unsigned>(chunks), static_cast<unsigned>(rows_per_block));
  // Enough tokens to give every multiprocessor a few blocks: one block per token, looping
  // over all heads (cos/sin loaded once per token). Otherwise split each token's heads
  // over blocks so that decode-sized calls still spread over the GPU.
  const std::int64_t blocks_wanted = 4LL * multiprocessor_count();
  std::int64_t heads_per_block = heads;
  if (tokens < blocks_wanted) {
    const std::int64_t splits = std::min((heads + rows_per_block - 1) / rows_per_block,
                                         (blocks_wanted + tokens - 1) / tokens);
    heads_per_block = (heads + splits - 1) / splits;
  }
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(tokens, 1LL << 30)),
                  static_cast<unsigned>((heads + heads_per_block - 1) / heads_per_block));
  // Templated on the common rotary dims (full rotary of heads of 64, 80, 96, 128 and 256, and
  // the partial 32 of GPT-NeoX/Pythia and 64 of GPT-J); any other size takes the generic one.
  switch (p.rotary_dim) {
    case 32:
      rope_vector_kernel<T, kLayout, 32><<<grid, block, 0, stream>>>(p, heads_per_block);
      break;
    case 64:
      rope_vector_kernel<T, kLayout, 64><<<grid, block, 0, stream>>>(p, heads_per_block);
      break;
    case 80:
      rope_vector_kernel<T, kLayout, 80><<<grid, block, 0, stream>>>(p, heads_per_block);
      break;
    case 96:
      rope_vector_kernel<T, kLayout, 96><<<grid, block, 0, stream>>>(p, heads_per_block);
      break;
    case 128:
      rope_vector_kernel<T, kLayout, 128><<<grid, block, 0, stream>>>(p, heads_per_block);
      break;
    case 256:
      rope_vector_kernel<T, kLayout, 256><<<grid, block, 0, stream>>>(p, heads_per_block);
      break;
    default:
      rope_vector_kernel<T, kLayout, 0><<<grid, block, 0, stream>>>(p, heads_per_block);
  }
  check_launch("rope_vector_kernel");
}

template <typename T>
void launch_for_table(const detail::RopeParams& p, cudaStream_t stream) {
  if (fits_vector_path<T>(p)) {
    if (p.layout == RopeLayout::neox) return launch_vector<T, RopeLayout::neox>(p, stream);
    return launch_vector<T, RopeLayout::interleaved>(p, stream);
  }
  detail::dispatch_value_dtype(p.table_dtype,
                               [&](auto c) { launch<T, typename decltype(c)::type>(p, stream); });
}

}  // namespace

void apply_rope(const detail::RopeParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  detail::dispatch_value_dtype(
      p.dtype, [&](auto t) { launch_for_table<typename decltype(t)::type>(p, to_cuda(stream)); });
}

}  // namespace embrope::gpu
