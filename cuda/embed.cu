// embed on the GPU: a group of G lanes per output row (a warp, or a sub-warp of 4-16 lanes
// when D is small, so that short rows still keep every lane busy), grid-stride over rows,
// 16-byte loads and stores when rows are aligned. Token row scaled, then
// the positional row (learned, or sinusoidal after Vaswani et al. 2017) and the type row
// added in float32 in that order, as on the CPU, and rounded once. Row resolution and
// range checks are detail::resolve_embed_row, shared with the CPU path.
#include <cstdint>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "../src/embed_row.hpp"
#include "bad_index.cuh"
#include "common.cuh"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/sinusoid.hpp"
#include "vector.cuh"

namespace embrope::gpu {
namespace {

using detail::from_float;

constexpr int kThreadsPerBlock = 256;

// W is the number of consecutive elements a lane handles: 16 / sizeof(T) on the fast path
// (aligned rows, D a multiple of W), 1 on the general path. G lanes (blockDim.x) share a row;
// blockDim.y rows run side by side in a block.
// kSinusoidal: the call adds sinusoidal positions (detail/sinusoid.hpp: a float64 reduction
// and float32 polynomials per element), in instantiations of their own so that the other
// paths keep their register budget.
// At least 4 blocks per multiprocessor, at most 64 registers: left to itself, ptxas chose
// 32 for the scalar float16 path and spilled. The sinusoidal paths hold W float64 angles in
// flight and get 2 blocks, 128 registers (64 spilled).
template <typename T, int W, int G, bool kSinusoidal>
__global__ void __launch_bounds__(kThreadsPerBlock, kSinusoidal ? 2 : 4)
    embed_kernel(const __grid_constant__ detail::EmbedParams p) {
  constexpr int kRowsPerBlock = kThreadsPerBlock / G;
  const int lane = threadIdx.x;
  const std::int64_t dim = p.dim;
  const std::int64_t half = dim / 2;
  const bool split = p.sinusoid_layout == SinusoidLayout::split;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock;
  for (std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kRowsPerBlock) + threadIdx.y;
       n < p.rows; n += row_stride) {
    // Every lane of the group resolves the same row: the id loads are one broadcast.
    const detail::EmbedRow r = detail::resolve_embed_row(p, n);
    T* out = static_cast<T*>(p.out) + r.out_offset;
    Chunk<T, W> result;
    if (r.bad_key != detail::kNoBadIndex) {
#pragma unroll
      for (int w = 0; w < W; ++w) result.v[w] = from_float<T>(0.0f);
      for (std::int64_t j = lane * W; j < dim; j += G * W) {
        *reinterpret_cast<Chunk<T, W>*>(out + j) = result;
      }
      if (lane == 0) report_bad_row(p.bad, r.bad_key);
      continue;
    }
    const T* token = static_cast<const T*>(p.table) + r.token * p.table_stride;
    const T* pos = p.position_table == nullptr ? nullptr
                                               : static_cast<const T*>(p.position_table) +
                                                     r.position * p.position_table_stride;
    const T* type = p.type_table == nullptr
                        ? nullptr
                        : static_cast<const T*>(p.type_table) + r.type * p.type_table_stride;
    for (std::int64_t j = lane * W; j < dim; j += G * W) {
      float v[W], add[W];
      if (r.token_hit) {
        load_chunk<T, W>(token + j, v);
#pragma unroll
        for (int w = 0; w < W; ++w) v[w] *= p.scale;
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) v[w] = 0.0f;
      }
      if (pos != nullptr) {
        load_chunk<T, W>(pos + j, add);
#pragma unroll
        for (int w = 0; w < W; ++w) v[w] += add[w];
      } else if constexpr (kSinusoidal) {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const std::int64_t e = j + w;
          const std::int64_t i = split ? (e < half ? e : e - half) : (e >> 1);
          const bool is_sin = split ? e < half : (e & 1) == 0;
          float sv, cv;
          detail::sinusoid_sin_cos(r.position, detail::sinusoid_freq(i, dim, p.sinusoid_base), &sv,
                                   &cv);
          v[w] += is_sin ? sv : cv;
        }
      }
      if (type != nullptr) {
        load_chunk<T, W>(type + j, add);
#pragma unroll
        for (int w = 0; w < W; ++w) v[w] += add[w];
      }
#pragma unroll
      for (int w = 0; w < W; ++w) result.v[w] = from_float<T>(v[w]);
      *reinterpret_cast<Chunk<T, W>*>(out + j) = result;
    }
  }
  if (last_block_done(p.bad)) {
    const std::int64_t key = current_key(p.bad);
    if (key != detail::kNoBadIndex && detail::bad_index_row(key) < p.rows) {
      const detail::EmbedRow r = detail::resolve_embed_row(p, detail::bad_index_row(key));
      if (r.bad_key == key) detail::describe_bad_index(p.bad, detail::BadIndexOp::embed, r.bad);
    }
  }
}

// The fast path needs D and every row start (pointers and row strides) in whole 16-byte
// chunks.
template <typename T>
bool fits_vector_path(const detail::EmbedParams& p) {
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
    if (p.index.stride[detail::RowIndex::out][d] % w != 0) return false;
  }
  return true;
}

template <typename T, int W, int G>
void launch_group(const detail::EmbedParams& p, cudaStream_t stream) {
  const dim3 block(G, kThreadsPerBlock / G);
  const unsigned grid = grid_for(p.rows, kThreadsPerBlock / G);
  if (p.positions == PositionEncoding::sinusoidal) {
    embed_kernel<T, W, G, true><<<grid, block, 0, stream>>>(p);
  } else {
    embed_kernel<T, W, G, false><<<grid, block, 0, stream>>>(p);
  }
}

template <typename T>
void launch(const detail::EmbedParams& p, cudaStream_t stream) {
  if (fits_vector_path<T>(p)) {
    constexpr int w = kVec16<T>;
    // The smallest group whose lanes cover a row in one 16-byte step each (at least 4 lanes).
    const std::int64_t chunks = p.dim / w;
    if (chunks <= 4) {
      launch_group<T, w, 4>(p, stream);
    } else if (chunks <= 8) {
      launch_group<T, w, 8>(p, stream);
    } else if (chunks <= 16) {
      launch_group<T, w, 16>(p, stream);
    } else {
      launch_group<T, w, 32>(p, stream);
    }
  } else {
    launch_group<T, 1, 32>(p, stream);
  }
  check_launch("embed_kernel");
}

}  // namespace

void embed(const detail::EmbedParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  detail::dispatch_value_dtype(
      p.dtype, [&](auto t) { launch<typename decltype(t)::type>(p, to_cuda(stream)); });
}

}  // namespace embrope::gpu
