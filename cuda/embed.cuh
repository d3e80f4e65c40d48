// The kernels of embed on the GPU and their launches, shared by embed.cu (float tables, the
// call's tables, the dispatch) and embed_quantized_<type>.cu (quantized token tables, one unit
// per output type: their kernels decode every format and took nvcc 3.5 of its 4 minutes for
// embed.cu when they were one unit with the rest; as three they compile side by side).
//
// embed on the GPU: a group of G lanes per output row (a warp, or a sub-warp of 4-16 lanes
// when D is small, so that short rows still keep every lane busy), grid-stride over rows,
// 16-byte loads and stores when rows are aligned. Token row scaled, then
// the positional row (learned, or sinusoidal after Vaswani et al. 2017) and the type row
// added in float32 in that order, as on the CPU, and rounded once. Row resolution and
// range checks are internal::resolve_embed_row, shared with the CPU path. With a norm
// (LayerNorm, Ba et al. 2016; RMSNorm, Zhang & Sennrich 2019), embed_norm_kernel below.
#pragma once

#include <cstdint>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "../src/embed_row.hpp"
#include "../src/quant_row.hpp"
#include "bad_index.cuh"
#include "block_shared.cuh"
#include "common.cuh"
#include "embrope/detail/norm_math.hpp"
#include "norm_reduce.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/sinusoid.hpp"
#include "vector.cuh"
#include "workspace.cuh"

namespace embrope::gpu {

// The sinusoids of a call as the CPU keeps them (src/cpu/sinusoid_rows.hpp): the frequencies
// w_i and the offsets' sin and cos, sin/cos(b w_i) for b < kSinusoidBlock rounded to float32,
// computed once by sinusoid_table_kernel into a workspace of 4 D + 128 D bytes (528 KiB for D
// 4096, an L2 resident). An element then costs the anchor's float64 sin/cos, where it cost a
// float64 pow and two sin/cos: the GPU ran float64-bound (a bfloat16 lookup of 16K rows of D
// 4096 took 609 us on an H100, 16% of a copy). The values are detail::sinusoid_sin_cos's bits.
// Every sinusoidal call builds one, a decoding step too: the table kernel is one short launch
// (D/2 x kSinusoidBlock threads), and one path is one set of bits to test.
struct SinusoidTable {
  const double* freq = nullptr;    // [D/2]
  const float2* offset = nullptr;  // [kSinusoidBlock][D/2]: (sin, cos) of b w_i
};

// The norm's per-element factors (internal::norm_factor) as float32 rows, computed once per
// call by norm_factor_kernel into the call's workspace (8 D bytes), as the CPU's norm_factors
// does. The output pass then loads a lane's 8 of each as two 16-byte loads, where it loaded
// each element of a weight and a bias of any dtype as a scalar (2- or 4-byte accesses, 12.5%
// of each request's sectors used, in the coalescing model).
struct NormFactors {
  const float* weight = nullptr;  // [D]
  const float* bias = nullptr;    // [D]
};

// embed from a quantized token table (p.quantized) into T, with or without a norm:
// launch_quantized_rows below, compiled in embed_quantized_<type>.cu.
template <typename T>
void launch_quantized(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                      const NormFactors& factors, cudaStream_t stream);
template <>
void launch_quantized<float>(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                             const NormFactors& factors, cudaStream_t stream);
template <>
void launch_quantized<detail::Half>(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                                    const NormFactors& factors, cudaStream_t stream);
template <>
void launch_quantized<detail::BFloat16>(const internal::EmbedParams& p,
                                        const SinusoidTable& sinusoids, const NormFactors& factors,
                                        cudaStream_t stream);

namespace {

using detail::from_float;

constexpr int kThreadsPerBlock = 256;

// The rows of the tables that a resolved row r reads (null where absent).
template <typename T>
struct RowTables {
  const T* token;
  const T* position;
  const T* type;
  __device__ RowTables(const internal::EmbedParams& p, const internal::EmbedRow& r)
      : token(p.quantized ? nullptr  // a quantized table: read by quant_table_chunk
                          : static_cast<const T*>(p.table) + r.token * p.table_stride),
        position(p.position_table == nullptr ? nullptr
                                             : static_cast<const T*>(p.position_table) +
                                                   r.position * p.position_table_stride),
        type(p.type_table == nullptr
                 ? nullptr
                 : static_cast<const T*>(p.type_table) + r.type * p.type_table_stride) {}
};

// sin and cos of position * w_i for the N pairs i = i0 .. i0 + N - 1 (detail::sinusoid_sin_cos)
// from the call's table. N even: i0 a multiple of N, and the table's rows start on 16 bytes
// (D a multiple of 4), so that a lane's frequencies and offsets are whole 16-byte loads.
template <int N>
__device__ __forceinline__ void sinusoid_pairs(const internal::EmbedParams& p,
                                               const SinusoidTable& table, std::int64_t position,
                                               std::int64_t i0, float* sin_out, float* cos_out) {
  const std::int64_t anchor = detail::sinusoid_anchor(position);
  const double* freq = table.freq + i0;
  const float2* offset = table.offset + (position - anchor) * (p.dim / 2) + i0;
  double w[N];
  float2 o[N];
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const double2 f = reinterpret_cast<const double2*>(freq)[k];
      const float4 q = reinterpret_cast<const float4*>(offset)[k];
      w[2 * k] = f.x;
      w[2 * k + 1] = f.y;
      o[2 * k] = make_float2(q.x, q.y);
      o[2 * k + 1] = make_float2(q.z, q.w);
    }
  } else {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      w[n] = freq[n];
      o[n] = offset[n];
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    detail::sinusoid_combine(detail::sin_cos_f64(static_cast<double>(anchor) * w[n]), o[n].x,
                             o[n].y, &sin_out[n], &cos_out[n]);
  }
}

// To v, the scaled token values of the W elements j .. j + W - 1 of row r: the position
// (learned or sinusoidal), then the type; sum_chunk's second half.
template <typename T, int W, bool kSinusoidal>
__device__ __forceinline__ void add_chunk(const internal::EmbedParams& p,
                                          const SinusoidTable& sinusoids,
                                          const internal::EmbedRow& r, const RowTables<T>& rows,
                                          std::int64_t j, float* v) {
  float add[W];
  if (rows.position != nullptr) {
    load_chunk<T, W>(rows.position + j, add);
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] += add[w];
  } else if constexpr (kSinusoidal) {
    const std::int64_t half = p.dim / 2;
    const bool split = p.sinusoid_layout == SinusoidLayout::split;
    bool done = false;
    if constexpr (W % 2 == 0) {
      if (!split) {  // interleaved: the chunk is the W/2 pairs from j / 2, each (sin, cos)
        float sv[W / 2], cv[W / 2];
        sinusoid_pairs<W / 2>(p, sinusoids, r.position, j >> 1, sv, cv);
#pragma unroll
        for (int n = 0; n < W / 2; ++n) {
          v[2 * n] += sv[n];
          v[2 * n + 1] += cv[n];
        }
        done = true;
      } else if (half % W == 0) {  // split, the chunk within one half: W sines or W cosines
        const bool sines = j < half;
        const std::int64_t i0 = sines ? j : j - half;
        // In two steps of W/2 pairs: W float64 sin/cos at once spill.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float sv[W / 2], cv[W / 2];
          sinusoid_pairs<W / 2>(p, sinusoids, r.position, i0 + h * (W / 2), sv, cv);
#pragma unroll
          for (int n = 0; n < W / 2; ++n) v[h * (W / 2) + n] += sines ? sv[n] : cv[n];
        }
        done = true;
      }
    }
    if (!done) {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const std::int64_t e = j + w;
        const std::int64_t i = split ? (e < half ? e : e - half) : (e >> 1);
        const bool is_sin = split ? e < half : (e & 1) == 0;
        float sv, cv;
        sinusoid_pairs<1>(p, sinusoids, r.position, i, &sv, &cv);
        v[w] += is_sin ? sv : cv;
      }
    }
  }
  if (rows.type != nullptr) {
    load_chunk<T, W>(rows.type + j, add);
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] += add[w];
  }
}

// v = the float32 sum of the W elements j .. j + W - 1 of row r (aligned to a W chunk):
// scale * token (zero for a shard miss) + position (learned or sinusoidal) + type, in that
// order, as on the CPU. kQuantized: the token table is p.quant, its values dequantized by the
// CPU's element formula (internal::quant_table_chunk: the chunk's group or block found once).
template <typename T, int W, bool kSinusoidal, bool kQuantized = false>
__device__ __forceinline__ void sum_chunk(const internal::EmbedParams& p,
                                          const SinusoidTable& sinusoids,
                                          const internal::EmbedRow& r, const RowTables<T>& rows,
                                          std::int64_t j, float* v) {
  if (r.token_hit) {
    if constexpr (kQuantized) {
      internal::quant_table_chunk<W>(p.quant, r.token, j, v);
    } else {
      load_chunk<T, W>(rows.token + j, v);
    }
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] *= p.scale;
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] = 0.0f;
  }
  add_chunk<T, W, kSinusoidal>(p, sinusoids, r, rows, j, v);
}

// Chunks of a quantized row whose loads a lane issues before it converts the first: one
// chunk's 8 bytes (4 for float32 outputs) in flight per lane had the int8 lookup of 16K rows of
// D 4096 into bfloat16 at 50% of a copy on an H200, issue-bound, its warps waiting on those
// loads a third of the time (Nsight Compute). One with sinusoidal positions, whose float64
// sin/cos take the registers.
template <bool kSinusoidal>
constexpr int kQuantChunksInFlight = kSinusoidal ? 1 : 4;

// Row r's chunks j = lane W + k G W from a quantized token table of format F (sum_chunk's
// sums in its order): kQuantChunksInFlight chunks' loads (internal::quant_chunk_load) before
// their conversions, the format known at compile time (its block sizes constants, its branches
// gone).
template <QuantFormat F, typename T, int W, int G, bool kSinusoidal>
__device__ __forceinline__ void quantized_row(const internal::EmbedParams& p,
                                              const SinusoidTable& sinusoids,
                                              const internal::EmbedRow& r, const RowTables<T>& rows,
                                              int lane, T* out) {
  constexpr int kChunks = kQuantChunksInFlight<kSinusoidal>;
  constexpr std::int64_t step = static_cast<std::int64_t>(G) * W;
  const std::int64_t dim = p.dim;
  const auto finish = [&](std::int64_t at, float* v) {
    add_chunk<T, W, kSinusoidal>(p, sinusoids, r, rows, at, v);
    Chunk<T, W> result;
#pragma unroll
    for (int w = 0; w < W; ++w) result.v[w] = from_float<T>(v[w]);
    *reinterpret_cast<Chunk<T, W>*>(out + at) = result;
  };
  const auto convert = [&](const internal::QuantChunk<W>& c, std::int64_t at) {
    float v[W];
    internal::quant_chunk_values<F, W>(p.quant, c, at, v);
#pragma unroll
    for (int w = 0; w < W; ++w) v[w] *= p.scale;
    finish(at, v);
  };
  std::int64_t j = lane * W;
  if (!r.token_hit) {  // a shard miss: zeros plus the additions
    for (; j < dim; j += step) {
      float v[W];
#pragma unroll
      for (int w = 0; w < W; ++w) v[w] = 0.0f;
      finish(j, v);
    }
    return;
  }
  for (; j + (kChunks - 1) * step < dim; j += kChunks * step) {
    internal::QuantChunk<W> c[kChunks];
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      c[u] = internal::quant_chunk_load<F, W>(p.quant, r.token, j + u * step);
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) convert(c[u], j + u * step);
  }
  for (; j < dim; j += step) convert(internal::quant_chunk_load<F, W>(p.quant, r.token, j), j);
}

// W is the number of consecutive elements a lane handles: 16 / sizeof(T) on the fast path
// (aligned rows, D a multiple of W), 1 on the general path. G lanes (blockDim.x) share a row;
// blockDim.y rows run side by side in a block.
// kSinusoidal: the call adds sinusoidal positions (detail/sinusoid.hpp: the anchor's float64
// sin/cos and the angle-addition combination per element, or per pair; SinusoidTable), in
// instantiations of their own so that the other paths keep their register budget.
// At least 4 blocks per multiprocessor, at most 64 registers: left to itself, ptxas chose
// 32 for the scalar float16 path and spilled. The sinusoidal paths hold W float64 sin/cos in
// flight and get 3 blocks, 80 registers (the 16-bit ones took 102 at 2 blocks; at 4 they
// spill).
// kQuantized: the token table is p.quant (quantized_row; W > 1 where each chunk lies in one of
// its groups or block runs, internal::quant_chunks_fit, and the rows are aligned to its loads).
// Its kQuantChunksInFlight chunks spilled under 64 registers: 3 blocks, 85 (more bytes in
// flight per multiprocessor at 24 warps than one chunk each at 32); with sinusoids, 2.
template <typename T, int W, int G, bool kSinusoidal, bool kQuantized>
__global__ void __launch_bounds__(kThreadsPerBlock,
                                  kQuantized ? (kSinusoidal ? 2 : 3) : (kSinusoidal ? 3 : 4))
    embed_kernel(const __grid_constant__ internal::EmbedParams p, const SinusoidTable sinusoids) {
  constexpr int kRowsPerBlock = kThreadsPerBlock / G;
  const int lane = threadIdx.x;
  const std::int64_t dim = p.dim;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock;
  // A plain lookup (scale 1, no positions or types) copies the token row's bits, as the CPU
  // does: no conversion to float32 and back (which would also turn a signalling NaN quiet).
  const bool copy_rows = !kSinusoidal && !kQuantized && p.positions == PositionEncoding::none &&
                         p.type_table == nullptr && p.scale == 1.0f;
  for (std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kRowsPerBlock) + threadIdx.y;
       n < p.rows; n += row_stride) {
    // Every lane of the group resolves the same row: the id loads are one broadcast.
    const internal::EmbedRow r = internal::resolve_embed_row(p, n);
    T* out = static_cast<T*>(p.out) + r.out_offset;
    Chunk<T, W> result;
    if (copy_rows && r.bad_key == internal::kNoBadIndex && r.token_hit) {
      const T* token = RowTables<T>(p, r).token;
      for (std::int64_t j = lane * W; j < dim; j += G * W) {
        *reinterpret_cast<Chunk<T, W>*>(out + j) = *reinterpret_cast<const Chunk<T, W>*>(token + j);
      }
      continue;
    }
    if (r.bad_key != internal::kNoBadIndex) {
#pragma unroll
      for (int w = 0; w < W; ++w) result.v[w] = from_float<T>(0.0f);
      for (std::int64_t j = lane * W; j < dim; j += G * W) {
        *reinterpret_cast<Chunk<T, W>*>(out + j) = result;
      }
      if (lane == 0) report_bad_row(p.bad, r.bad_key);
      continue;
    }
    const RowTables<T> rows(p, r);
    if constexpr (!kSinusoidal && !kQuantized) {
      // Two chunks of the row per step, every token, position and type load of both issued
      // before the first sum uses one: with sum_chunk's order (the token's product, then
      // each add after its own load) a lane kept one 16-byte load in flight, and the model
      // put bfloat16 with learned positions at 68% of its Little bound. The sums are
      // sum_chunk's, in its order.
      constexpr std::int64_t step = static_cast<std::int64_t>(G) * W;
      for (std::int64_t j = lane * W; j < dim; j += 2 * step) {
        const bool second = j + step < dim;
        Chunk<T, W> token[2], position[2], type[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (u == 1 && !second) break;
          const std::int64_t at = j + u * step;
          if (r.token_hit) token[u] = *reinterpret_cast<const Chunk<T, W>*>(rows.token + at);
          if (rows.position != nullptr) {
            position[u] = *reinterpret_cast<const Chunk<T, W>*>(rows.position + at);
          }
          if (rows.type != nullptr) {
            type[u] = *reinterpret_cast<const Chunk<T, W>*>(rows.type + at);
          }
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (u == 1 && !second) break;
#pragma unroll
          for (int w = 0; w < W; ++w) {
            float v = r.token_hit ? detail::to_float(token[u].v[w]) * p.scale : 0.0f;
            if (rows.position != nullptr) v += detail::to_float(position[u].v[w]);
            if (rows.type != nullptr) v += detail::to_float(type[u].v[w]);
            result.v[w] = from_float<T>(v);
          }
          *reinterpret_cast<Chunk<T, W>*>(out + j + u * step) = result;
        }
      }
    } else if constexpr (kQuantized) {
      EMBROPE_DISPATCH_QUANT_FORMAT(
          p.quant.format, kFormat,
          quantized_row<kFormat, T, W, G, kSinusoidal>(p, sinusoids, r, rows, lane, out))
    } else {
      for (std::int64_t j = lane * W; j < dim; j += G * W) {
        float v[W];
        sum_chunk<T, W, kSinusoidal>(p, sinusoids, r, rows, j, v);
#pragma unroll
        for (int w = 0; w < W; ++w) result.v[w] = from_float<T>(v[w]);
        *reinterpret_cast<Chunk<T, W>*>(out + j) = result;
      }
    }
  }
  if (last_block_done(p.bad)) {
    const std::int64_t key = current_key(p.bad);
    if (key != internal::kNoBadIndex && internal::bad_index_row(key) < p.rows) {
      const internal::EmbedRow r = internal::resolve_embed_row(p, internal::bad_index_row(key));
      if (r.bad_key == key) internal::describe_bad_index(p.bad, internal::BadIndexOp::embed, r.bad);
    }
  }
}

// embed with a norm: 32 lanes per row, lane l owning elements 256 t + 8 l + w of the row (step
// t), so that its 8 running sums are partials 8 l + w of detail/norm_math.hpp; the partials are
// then combined by halving in shared memory, the order of the CPU. Up to three passes over the
// row (layer_norm's sum, the squared deviations, the output). kHeldSteps > 0: the lane's
// float32 sums of the tables' rows for steps t < kHeldSteps (D <= 256 kHeldSteps) are computed
// once, before the first pass (no store between the row's loads, so they can all be in
// flight together: 2 KB per warp in the SASS scan), and held in registers for the
// later passes; 0: each pass recomputes them (L1/L2 hits after the first), for any D. Holding
// them took the model's L1 sectors per DRAM sector from 6.1 (bfloat16) and 8.1 (float32) to
// 4.1: what is left is the weight and bias (and a type row), which every row reads. kVector: rows
// in whole 16-byte chunks and D a multiple of 8 (16-bit values: one load per lane per step;
// float32: two). The output pass takes the weight and bias from the call's NormFactors. Blocks of
// kNormBlockRows rows (64 threads): the barriers of the reduction need every thread of the block in
// every step, so the block walks its rows in lockstep, with inactive slots (past the last row, or
// bad rows) contributing zero partials. Registers: 64 (16 blocks per multiprocessor) without held
// steps, 128 for the sinusoidal paths, up to 96, 128 and 200 for 4, 8 and 16 held steps
// (kNormMinBlocks: no spills).
constexpr int kNormThreadsPerBlock = kNormBlockRows * detail::kNormLanes;
template <bool kSinusoidal, int kHeldSteps>
constexpr int kNormMinBlocks = kHeldSteps > 8   ? 5
                               : kHeldSteps > 4 ? 8
                               : kHeldSteps > 0 ? 10
                               : kSinusoidal    ? 8
                                                : 16;
// kQuantized: the token table is p.quant (kVector false).
template <typename T, bool kVector, bool kSinusoidal, bool kQuantized, int kHeldSteps = 0>
__global__ void __launch_bounds__(kNormThreadsPerBlock, kNormMinBlocks<kSinusoidal, kHeldSteps>)
    embed_norm_kernel(const __grid_constant__ internal::EmbedParams p,
                      const SinusoidTable sinusoids, const NormFactors factors) {
  constexpr int kLanes = detail::kNormLanes;
  constexpr int kWidth = detail::kNormLaneWidth;
  constexpr int kRowsPerBlock = kNormBlockRows;
  constexpr int kLoad = kVector ? kVec16<T> : 1;  // elements per access
  static_assert(kWidth % kVec16<T> == 0, "a lane's elements are whole 16-byte chunks");
  static_assert(kHeldSteps == 0 || (kVector && !kSinusoidal && !kQuantized),
                "rows held in registers: the 16-byte path of learned or no positions");
  const int lane = threadIdx.x;
  const int slot = threadIdx.y;
  const std::int64_t dim = p.dim;
  auto reduce = [&](const float* part) { return reduce_norm_partials(part, slot, lane); };
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock;
  for (std::int64_t first = blockIdx.x * static_cast<std::int64_t>(kRowsPerBlock); first < p.rows;
       first += row_stride) {
    const std::int64_t n = first + slot;
    internal::EmbedRow r;
    if (n < p.rows) r = internal::resolve_embed_row(p, n);
    const bool good = n < p.rows && r.bad_key == internal::kNoBadIndex;
    T* out = static_cast<T*>(p.out) + r.out_offset;
    if (n < p.rows && !good) {  // zero-filled, like the lookup without a norm
      for (std::int64_t j = lane; j < dim; j += kLanes) {
        out[j] = from_float<T>(0.0f);
        if (p.pre_norm_out != nullptr) {
          internal::store_value(p.pre_norm_out, p.pre_norm_dtype, r.pre_norm_offset + j, 0.0f);
        }
      }
      if (lane == 0) report_bad_row(p.bad, r.bad_key);
    }
    const RowTables<T> rows(p, r);
    // v = the row's float32 sums at elements j0 .. j0 + kWidth - 1 (0 past D).
    auto values = [&](std::int64_t j0, float* v) {
      if constexpr (kVector) {
#pragma unroll
        for (int c = 0; c < kWidth; c += kLoad)
          sum_chunk<T, kLoad, kSinusoidal, kQuantized>(p, sinusoids, r, rows, j0 + c, v + c);
      } else {
#pragma unroll
        for (int w = 0; w < kWidth; ++w) {
          v[w] = 0.0f;
          if (j0 + w < dim) {
            sum_chunk<T, 1, kSinusoidal, kQuantized>(p, sinusoids, r, rows, j0 + w, v + w);
          }
        }
      }
    };
    // held[t]: the lane's sums at step t, its first element step_start(t) (with kHeldSteps 0,
    // one step, unused). for_each_step(step) calls step(j0, v) for each of the lane's steps,
    // v its sums, held or recomputed.
    float held[kHeldSteps > 0 ? kHeldSteps : 1][kWidth];
    auto step_start = [&](int t) {
      return lane * kWidth + t * static_cast<std::int64_t>(kLanes * kWidth);
    };
    auto for_each_step = [&](auto step) {
      if constexpr (kHeldSteps > 0) {
#pragma unroll
        for (int t = 0; t < kHeldSteps; ++t) {
          if (step_start(t) < dim) step(step_start(t), held[t]);
        }
      } else {
        float v[kWidth];
        for (std::int64_t j0 = lane * kWidth; j0 < dim; j0 += kLanes * kWidth) {
          values(j0, v);
          step(j0, v);
        }
      }
    };
    if constexpr (kHeldSteps > 0) {
      if (good) {
#pragma unroll
        for (int t = 0; t < kHeldSteps; ++t) {
          if (step_start(t) < dim) values(step_start(t), held[t]);
        }
      }
    }
    float part[kWidth];

    // Pass 1 (layer_norm): the sum, for the mean.
    detail::NormStats stats;
    if (p.norm == Normalization::layer_norm) {
#pragma unroll
      for (int w = 0; w < kWidth; ++w) part[w] = 0.0f;
      if (good) {
        for_each_step([&](std::int64_t, const float* v) {
#pragma unroll
          for (int w = 0; w < kWidth; ++w) part[w] += v[w];  // zeros past D add nothing
        });
      }
      stats.mean = detail::norm_mean(reduce(part), dim);
    }

    // Pass 2: the squared deviations (squares for rms_norm), and the pre-norm row.
#pragma unroll
    for (int w = 0; w < kWidth; ++w) part[w] = 0.0f;
    if (good) {
      for_each_step([&](std::int64_t j0, const float* v) {
#pragma unroll
        for (int w = 0; w < kWidth; ++w) {
          if (kVector || j0 + w < dim) part[w] += detail::norm_square_term(v[w], stats.mean);
        }
        if (p.pre_norm_out != nullptr) {
          for (int w = 0; w < kWidth && j0 + w < dim; ++w) {
            internal::store_value(p.pre_norm_out, p.pre_norm_dtype, r.pre_norm_offset + j0 + w,
                                  v[w]);
          }
        }
      });
    }
    stats.rstd = detail::norm_rstd(reduce(part), dim, p.norm_eps);

    // Pass 3: the normalised row, rounded once.
    if (!good) continue;
    for_each_step([&](std::int64_t j0, const float* v) {
      float weight[kWidth], bias[kWidth];
      if constexpr (kVector) {  // j0 a multiple of 8, the rows on 256 bytes: whole float4s
        load_floats<kWidth>(factors.weight + j0, weight);
        load_floats<kWidth>(factors.bias + j0, bias);
      } else {
#pragma unroll
        for (int w = 0; w < kWidth; ++w) {
          const std::int64_t j = j0 + w < dim ? j0 + w : 0;  // in range for the loads
          weight[w] = factors.weight[j];
          bias[w] = factors.bias[j];
        }
      }
      T result[kWidth];
#pragma unroll
      for (int w = 0; w < kWidth; ++w) {
        result[w] = from_float<T>(detail::norm_apply(v[w], stats, weight[w], bias[w]));
      }
      if constexpr (kVector) {
#pragma unroll
        for (int c = 0; c < kWidth; c += kLoad) {
          Chunk<T, kLoad> chunk;
#pragma unroll
          for (int w = 0; w < kLoad; ++w) chunk.v[w] = result[c + w];
          *reinterpret_cast<Chunk<T, kLoad>*>(out + j0 + c) = chunk;
        }
      } else {
        for (int w = 0; w < kWidth && j0 + w < dim; ++w) out[j0 + w] = result[w];
      }
    });
  }
  if (last_block_done(p.bad)) {
    const std::int64_t key = current_key(p.bad);
    if (key != internal::kNoBadIndex && internal::bad_index_row(key) < p.rows) {
      const internal::EmbedRow r = internal::resolve_embed_row(p, internal::bad_index_row(key));
      if (r.bad_key == key) internal::describe_bad_index(p.bad, internal::BadIndexOp::embed, r.bad);
    }
  }
}

// The fast path needs D and every row start (pointers and row strides) in whole 16-byte
// chunks.
template <typename T>
bool fits_vector_path(const internal::EmbedParams& p) {
  constexpr std::int64_t w = kVec16<T>;
  if (p.dim % w != 0) return false;
  for (const void* table :
       {p.table, p.position_table, p.type_table, static_cast<const void*>(p.out)}) {
    if (!is_aligned(table, 16)) return false;  // null (absent) tables are aligned
  }
  if (p.table_stride % w != 0 || p.position_table_stride % w != 0 || p.type_table_stride % w != 0) {
    return false;
  }
  for (int d = 0; d < p.index.ndim; ++d) {
    if (p.index.stride[internal::RowIndex::out][d] % w != 0) return false;
  }
  return true;
}

template <typename T, bool kQuantized = false>
void launch_norm(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                 const NormFactors& factors, cudaStream_t stream) {
  const dim3 block(detail::kNormLanes, kNormBlockRows);
  const unsigned grid = grid_for(p.rows, kNormBlockRows, detail::kNormLanes * kNormBlockRows);
  const bool sinusoidal = p.positions == PositionEncoding::sinusoidal;
  // A lane's 8 elements are whole vector accesses only when D is a multiple of 8 (for
  // float32, a multiple of 4 is not enough). A quantized table: the scalar path (chunks of 8
  // of its values in the vector path spilled under this kernel's 64 registers); its units
  // (embed_quantized_<type>.cu) instantiate no vector kernel.
  if constexpr (!kQuantized) {
    if (fits_vector_path<T>(p) && p.dim % detail::kNormLaneWidth == 0) {
      // Learned or no positions: the row held in registers when D fits 4, 8 or 16 steps of
      // 256 (BERT's 768 and 1024 in 4, Llama-sized 4096 in 16).
      const std::int64_t steps = (p.dim + detail::kNormPartials - 1) / detail::kNormPartials;
      if (sinusoidal) {
        embed_norm_kernel<T, true, true, false><<<grid, block, 0, stream>>>(p, sinusoids, factors);
      } else if (steps <= 4) {
        embed_norm_kernel<T, true, false, false, 4>
            <<<grid, block, 0, stream>>>(p, sinusoids, factors);
      } else if (steps <= 8) {
        embed_norm_kernel<T, true, false, false, 8>
            <<<grid, block, 0, stream>>>(p, sinusoids, factors);
      } else if (steps <= 16) {
        embed_norm_kernel<T, true, false, false, 16>
            <<<grid, block, 0, stream>>>(p, sinusoids, factors);
      } else {
        embed_norm_kernel<T, true, false, false><<<grid, block, 0, stream>>>(p, sinusoids, factors);
      }
      check_launch("embed_norm_kernel");
      return;
    }
  }
  if (sinusoidal) {
    embed_norm_kernel<T, false, true, kQuantized>
        <<<grid, block, 0, stream>>>(p, sinusoids, factors);
  } else {
    embed_norm_kernel<T, false, false, kQuantized>
        <<<grid, block, 0, stream>>>(p, sinusoids, factors);
  }
  check_launch("embed_norm_kernel");
}

template <typename T, int W, int G, bool kQuantized = false>
void launch_group(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                  cudaStream_t stream) {
  const dim3 block(G, kThreadsPerBlock / G);
  const unsigned grid = grid_for(p.rows, kThreadsPerBlock / G, kThreadsPerBlock);
  if (p.positions == PositionEncoding::sinusoidal) {
    embed_kernel<T, W, G, true, kQuantized><<<grid, block, 0, stream>>>(p, sinusoids);
  } else {
    embed_kernel<T, W, G, false, kQuantized><<<grid, block, 0, stream>>>(p, sinusoids);
  }
}

// The vector path: chunks of kVec16 values, the smallest group whose lanes cover a row in one
// 16-byte step each (at least 4 lanes).
template <typename T, bool kQuantized>
void launch_vector_groups(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                          cudaStream_t stream) {
  constexpr int w = kVec16<T>;
  const std::int64_t chunks = p.dim / w;
  if (chunks <= 4) {
    launch_group<T, w, 4, kQuantized>(p, sinusoids, stream);
  } else if (chunks <= 8) {
    launch_group<T, w, 8, kQuantized>(p, sinusoids, stream);
  } else if (chunks <= 16) {
    launch_group<T, w, 16, kQuantized>(p, sinusoids, stream);
  } else {
    launch_group<T, w, 32, kQuantized>(p, sinusoids, stream);
  }
}

template <typename T>
void launch_quantized_rows(const internal::EmbedParams& p, const SinusoidTable& sinusoids,
                           const NormFactors& factors, cudaStream_t stream) {
  if (p.norm != Normalization::none) {
    launch_norm<T, true>(p, sinusoids, factors, stream);
    return;
  }
  // Chunks of kVec16 values (16-byte stores) where each lies in one of the table's groups or
  // block runs and the rows allow its loads (quant_chunk_granule: every contiguous table
  // does), else one value per lane.
  if (fits_vector_path<T>(p) && internal::quant_chunks_fit(p.quant, kVec16<T>) &&
      internal::quant_rows_aligned(p.quant, kVec16<T>)) {
    launch_vector_groups<T, true>(p, sinusoids, stream);
  } else {
    launch_group<T, 1, 32, true>(p, sinusoids, stream);
  }
  check_launch("embed_kernel");
}

}  // namespace

}  // namespace embrope::gpu
