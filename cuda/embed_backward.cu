// embed_backward on the GPU (docs/ops.md, "embed_backward"). Two modes:
//
// Deterministic, after PyTorch's embedding_dense_backward (aten/src/ATen/native/cuda/
// Embedding.cu and EmbeddingBackwardKernel.cu), with no host synchronisation:
//   1. keys: every (gradient table, grad_out row) pair becomes an item whose key is the
//      table row (the three tables' rows numbered one after another) and whose value is the
//      grad_out row's element offset; rows that give nothing (padding, shard misses, bad
//      rows) get a sentinel key that sorts last;
//   2. cub::DeviceRadixSort::SortPairs over only the key bits the tables need (end_bit). The
//      sort is stable, so each key's rows stay in ascending grad_out order;
//   3. cub::DeviceRunLengthEncode::Encode: one run per table row, its key and length; the
//      number of runs stays on the device;
//   4. cub::DeviceScan::ExclusiveSum of the lengths: where each run starts;
//   5. runs longer than detail::kEmbedBackwardChunk rows (a frequent token) are split into
//      chunks of that many rows; another ExclusiveSum numbers the chunks, one warp sums each
//      chunk into a float32 workspace row (partial_sums_kernel);
//   6. one warp per run (reduce_runs_kernel) sums a short run's rows, or a long run's chunk
//      sums, in a fixed order, and writes its table row once.
// Kernels after the sort are launched over the largest possible number of runs or chunks;
// warps past the device-side count return at once. The order of every addition is fixed by
// the data alone, so results are bitwise identical from run to run and for any grid, and
// equal to the CPU path's (src/cpu/embedding_backward.cpp sums in the same order).
// Temporary storage follows CUB's two-phase protocol (a first call with null storage returns
// the size), gathered in one workspace (embed_backward_workspace_size).
//
// Atomic: one warp per grad_out row, float32 atomicAdd into each float32 gradient row. One
// pass, no workspace; the order of additions varies between runs, hence the rounding.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <string>

#include "../src/backend.hpp"
#include "../src/dispatch.hpp"
#include "../src/embed_row.hpp"
#include "bad_index.cuh"
#include "block_shared.cuh"
#include "common.cuh"
#include "embrope/detail/embed_backward_math.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "norm_reduce.cuh"
#include "vector.cuh"
#include "workspace.cuh"

namespace embrope::gpu {
namespace {

using detail::BFloat16;
using detail::from_float;
using detail::Half;
using detail::to_float;
using Params = internal::EmbedBackwardParams;

constexpr int kWarpsPerBlock = 8;
constexpr int kChunk = static_cast<int>(detail::kEmbedBackwardChunk);

// How the items of the deterministic pipeline are numbered (host-computed).
struct KeyLayout {
  int slots = 0;                           // gradient tables given
  int slot_target[Params::count] = {};     // the table of each slot
  std::uint32_t base[Params::count] = {};  // the first key of each table
  std::uint32_t sentinel = 0;              // the key of rows that give nothing (sorts last)
  int end_bit = 1;                         // bits of the sentinel: the radix sort's end_bit
  std::int64_t rows = 0;                   // grad_out rows
  int items = 0;                           // rows * slots
  int max_chunks = 0;                      // bound on the chunks of long runs
};

// Run by one thread of the last block: describe the recorded bad row if it is one of ours.
__device__ void describe_bad_row(const Params& p) {
  const std::int64_t key = current_key(p.rows.bad);
  if (key == internal::kNoBadIndex || internal::bad_index_row(key) >= p.rows.rows) return;
  const internal::EmbedRow r = internal::resolve_embed_row(p.rows, internal::bad_index_row(key));
  if (r.bad_key == key) {
    internal::describe_bad_index(p.rows.bad, internal::BadIndexOp::embed_backward, r.bad);
  }
}

// ------------------------------------------------------------- deterministic mode ----

// 1. One item per (slot, row): key and grad_out offset. Bad rows are reported once (slot 0).
__global__ void keys_kernel(const __grid_constant__ Params p,
                            const __grid_constant__ KeyLayout layout, std::uint32_t* keys,
                            std::int64_t* values) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < layout.items; i += stride) {
    const int slot = static_cast<int>(i / layout.rows);
    const std::int64_t n = i - slot * layout.rows;
    const internal::BackwardRow b = internal::resolve_backward_row(p, n);
    const int target = layout.slot_target[slot];
    // Selects, not b.target[target]: a run-time index into a local array puts it in local
    // memory.
    const std::int64_t row = target == 0 ? b.target[0] : (target == 1 ? b.target[1] : b.target[2]);
    keys[i] = row >= 0 ? layout.base[target] + static_cast<std::uint32_t>(row) : layout.sentinel;
    values[i] = b.out_offset;
    if (slot == 0 && b.bad_key != internal::kNoBadIndex) report_bad_row(p.rows.bad, b.bad_key);
  }
  if (last_block_done(p.rows.bad)) describe_bad_row(p);
}

// 5a. The number of chunks of each run: 0 for short runs, the sentinel's run and the slots
// past the number of runs.
__global__ void count_chunks_kernel(const __grid_constant__ KeyLayout layout,
                                    const std::uint32_t* run_keys, const int* run_lengths,
                                    const int* num_runs, int* chunks) {
  const int runs = *num_runs;
  // 64-bit counters: items may be close to 2^31 - 1, and r + stride must not overflow.
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       r < layout.items; r += stride) {
    int c = 0;
    if (r < runs && run_keys[r] != layout.sentinel && run_lengths[r] > kChunk) {
      // (Not (length + kChunk - 1) / kChunk: a run of nearly 2^31 rows would overflow it.)
      c = run_lengths[r] / kChunk + (run_lengths[r] % kChunk != 0 ? 1 : 0);
    }
    chunks[r] = c;
  }
}

// 5b. One warp per chunk of a long run: the float32 sum of its rows, in row order, into
// partials[chunk]. W: elements per lane and access (16 bytes of T on the vector path).
// At least 4 blocks per multiprocessor: at most 64 registers, which keeps the vector paths'
// accumulators in registers (left to itself, ptxas chose 32 and spilled).
template <typename T, int W>
__global__ void __launch_bounds__(32 * kWarpsPerBlock, 4)
    partial_sums_kernel(const __grid_constant__ Params p, const std::int64_t* offsets,
                        const int* run_starts, const int* run_lengths, const int* chunks,
                        const int* chunk_starts, const int* num_runs, float* partials) {
  const int runs = *num_runs;
  if (runs == 0) return;
  const int total = chunk_starts[runs - 1] + chunks[runs - 1];
  const std::int64_t dim = p.rows.dim;
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  const int lane = threadIdx.x;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
       c < total; c += warp_stride) {
    // The run that holds chunk c: the last run whose first chunk is at or before c (runs
    // without chunks share their successor's start and are skipped by "last").
    int lo = 0, hi = runs - 1;
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;  // lo + hi + 1 could pass 2^31
      if (chunk_starts[mid] <= c) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int k = static_cast<int>(c - chunk_starts[lo]);
    // Within the run, whose end is at most the items (< 2^31): begin + kChunk could pass it.
    const int run_end = run_starts[lo] + run_lengths[lo];
    const int begin = run_starts[lo] + k * kChunk;
    const int end = begin + min(kChunk, run_end - begin);
    float* out = partials + static_cast<std::int64_t>(c) * dim;
    for (std::int64_t j = lane * W; j < dim; j += 32 * W) {
      float part[W], v[W];
#pragma unroll
      for (int w = 0; w < W; ++w) part[w] = 0.0f;
      for (int i = begin; i < end; ++i) {
        load_chunk<T, W>(grad_out + offsets[i] + j, v);
#pragma unroll
        for (int w = 0; w < W; ++w) part[w] += v[w];
      }
#pragma unroll
      for (int w = 0; w < W; ++w) out[j + w] = part[w];
    }
  }
}

// Writes W elements of a gradient row: grad = existing + weight * total, rounded once.
template <typename G, int W>
__device__ __forceinline__ void write_gradient(G* grad, const float* total, float weight) {
  Chunk<G, W> c = *reinterpret_cast<const Chunk<G, W>*>(grad);
#pragma unroll
  for (int w = 0; w < W; ++w) {
    c.v[w] = from_float<G>(detail::accumulate_gradient(to_float(c.v[w]), total[w], weight));
  }
  *reinterpret_cast<Chunk<G, W>*>(grad) = c;
}

// 6. One warp per run: its table row's sum (the rows of a short run, or the chunk sums of
// a long one, in order) added to the gradient row, which is written once.
template <typename T, int W>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    reduce_runs_kernel(const __grid_constant__ Params p, const __grid_constant__ KeyLayout layout,
                       const std::int64_t* offsets, const std::uint32_t* run_keys,
                       const int* run_starts, const int* run_lengths, const int* chunks,
                       const int* chunk_starts, const int* num_runs, const float* partials) {
  const int runs = *num_runs;
  const std::int64_t dim = p.rows.dim;
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  const int lane = threadIdx.x;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
       r < runs; r += warp_stride) {
    const std::uint32_t key = run_keys[r];
    if (key == layout.sentinel) continue;
    int target = layout.slot_target[0];
    for (int s = 1; s < layout.slots; ++s) {
      if (key >= layout.base[layout.slot_target[s]]) target = layout.slot_target[s];
    }
    const internal::GradTable& g = p.targets[target];
    const std::int64_t row = key - layout.base[target];
    const int begin = run_starts[r];
    const int length = run_lengths[r];
    const int n_chunks = chunks[r];
    for (std::int64_t j = lane * W; j < dim; j += 32 * W) {
      float total[W], v[W];
#pragma unroll
      for (int w = 0; w < W; ++w) total[w] = 0.0f;
      if (n_chunks == 0) {
        float part[W];
#pragma unroll
        for (int w = 0; w < W; ++w) part[w] = 0.0f;
        for (int i = begin; i < begin + length; ++i) {
          load_chunk<T, W>(grad_out + offsets[i] + j, v);
#pragma unroll
          for (int w = 0; w < W; ++w) part[w] += v[w];
        }
#pragma unroll
        for (int w = 0; w < W; ++w) total[w] += part[w];
      } else {
        const float* part = partials + static_cast<std::int64_t>(chunk_starts[r]) * dim + j;
        for (int k = 0; k < n_chunks; ++k, part += dim) {
#pragma unroll
          for (int w = 0; w < W; ++w) total[w] += part[w];
        }
      }
      // float32 or grad_out's dtype, or any of the three after a norm (dx is float32).
      if (g.dtype == DType::float32) {
        write_gradient<float, W>(static_cast<float*>(g.grad) + row * g.stride + j, total, g.weight);
      } else if (g.dtype == DType::float16) {
        write_gradient<Half, W>(static_cast<Half*>(g.grad) + row * g.stride + j, total, g.weight);
      } else {
        write_gradient<BFloat16, W>(static_cast<BFloat16*>(g.grad) + row * g.stride + j, total,
                                    g.weight);
      }
    }
  }
}

// ------------------------------------------------------------------ the norm's backward ----
// With embed's norm (docs/ops.md, "embed_backward"), before the tables' pass:
//   N1. norm_rows_kernel: 32 lanes per row (lane l owning elements 256 t + 8 l + w, the
//       partials of detail/norm_math.hpp, combined in shared memory in the CPU's order), in
//       blocks of kNormBlockRows rows walked in lockstep like embed_norm_kernel: mean and
//       rstd from the saved pre-norm row, the sums of u * xhat and u, then dx as float32
//       into the workspace; each row's statistics (and whether it is good) for N2;
//   N2. norm_partials_kernel: a thread per (chunk of kWeightGradRows rows, column): the
//       chunk's sums of g * xhat and g, rows in order;
//   N3. norm_gradients_kernel: a thread per column: the chunk partials summed in order into
//       grad_norm_weight and grad_norm_bias.
// The tables' pass then reads dx in the place of grad_out (internal::norm_scatter_params).

// The statistics of a row for norm_partials_kernel; a bad row (good 0) gives nothing to any
// gradient.
struct RowStats {
  float mean;
  float rstd;
  int good;
};

// Elements j0 .. j0 + kNormLaneWidth - 1 of a row of V at `row`, as float32 (0 past dim): in
// 16-byte loads when the lane's elements are whole and aligned, else one by one.
template <typename V>
__device__ __forceinline__ void load_lane_values(const V* row, std::int64_t j0, std::int64_t dim,
                                                 float* v) {
  constexpr int kWidth = detail::kNormLaneWidth;
  const V* at = row + j0;
  if (j0 + kWidth <= dim && reinterpret_cast<std::uintptr_t>(at) % 16 == 0) {
#pragma unroll
    for (int c = 0; c < kWidth; c += kVec16<V>) load_chunk<V, kVec16<V>>(at + c, v + c);
  } else {
#pragma unroll
    for (int w = 0; w < kWidth; ++w) v[w] = j0 + w < dim ? detail::to_float(at[w]) : 0.0f;
  }
}

// The same for a float32, float16 or bfloat16 row (the dtype is the same for every lane).
__device__ __forceinline__ void load_lane_values(const void* base, DType dtype, std::int64_t offset,
                                                 std::int64_t j0, std::int64_t dim, float* v) {
  if (dtype == DType::float32) {
    load_lane_values(static_cast<const float*>(base) + offset, j0, dim, v);
  } else if (dtype == DType::float16) {
    load_lane_values(static_cast<const Half*>(base) + offset, j0, dim, v);
  } else {
    load_lane_values(static_cast<const BFloat16*>(base) + offset, j0, dim, v);
  }
}

// The weight factor of element j (1 without a weight).
__device__ __forceinline__ float norm_weight_at(const Params& p, std::int64_t j) {
  return p.rows.norm_weight == nullptr
             ? 1.0f
             : detail::norm_weight_factor(
                   internal::load_vector_value(p.rows.norm_weight, p.rows.norm_weight_dtype, j),
                   p.rows.norm_unit_offset);
}

constexpr int kNormRowThreads = kNormBlockRows * detail::kNormLanes;

// N1. dx of each good row into dx [rows, D], and every row's statistics into `stats`.
// (kNormRowThreads, 8): with the bound alone ptxas kept to 64 registers and spilled around the
// reductions; 8 blocks (16 warps) per multiprocessor leave it 128.
__global__ void __launch_bounds__(kNormRowThreads, 8)
    norm_rows_kernel(const __grid_constant__ Params p, float* dx, RowStats* stats) {
  constexpr int kLanes = detail::kNormLanes;
  constexpr int kWidth = detail::kNormLaneWidth;
  const int lane = threadIdx.x;
  const int slot = threadIdx.y;
  const std::int64_t dim = p.rows.dim;
  const bool layer = p.rows.norm == Normalization::layer_norm;
  auto reduce = [&](const float* part) { return reduce_norm_partials(part, slot, lane); };
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kNormBlockRows;
  for (std::int64_t first = blockIdx.x * static_cast<std::int64_t>(kNormBlockRows);
       first < p.rows.rows; first += row_stride) {
    const std::int64_t n = first + slot;
    internal::EmbedRow r;
    if (n < p.rows.rows) r = internal::resolve_embed_row(p.rows, n);
    const bool good = n < p.rows.rows && r.bad_key == internal::kNoBadIndex;
    float part[kWidth], x[kWidth];
    auto pre = [&](std::int64_t j0) {
      load_lane_values(p.pre_norm, p.pre_norm_dtype, r.pre_norm_offset, j0, dim, x);
    };

    // The statistics, in the forward's order (embed_norm_kernel's passes 1 and 2).
    detail::NormStats s;
    if (layer) {
#pragma unroll
      for (int w = 0; w < kWidth; ++w) part[w] = 0.0f;
      for (std::int64_t j0 = lane * kWidth; good && j0 < dim; j0 += kLanes * kWidth) {
        pre(j0);
#pragma unroll
        for (int w = 0; w < kWidth; ++w) part[w] += x[w];  // zeros past D add nothing
      }
      s.mean = detail::norm_mean(reduce(part), dim);
    }
#pragma unroll
    for (int w = 0; w < kWidth; ++w) part[w] = 0.0f;
    for (std::int64_t j0 = lane * kWidth; good && j0 < dim; j0 += kLanes * kWidth) {
      pre(j0);
#pragma unroll
      for (int w = 0; w < kWidth; ++w) {
        if (j0 + w < dim) part[w] += detail::norm_square_term(x[w], s.mean);
      }
    }
    s.rstd = detail::norm_rstd(reduce(part), dim, p.rows.norm_eps);

    // The sums of u * xhat and of u (layer_norm), u = w * g.
    float part_u[kWidth];
#pragma unroll
    for (int w = 0; w < kWidth; ++w) part[w] = part_u[w] = 0.0f;
    for (std::int64_t j0 = lane * kWidth; good && j0 < dim; j0 += kLanes * kWidth) {
      float g[kWidth];
      pre(j0);
      load_lane_values(p.rows.out, p.rows.dtype, r.out_offset, j0, dim, g);
#pragma unroll
      for (int w = 0; w < kWidth; ++w) {
        if (j0 + w >= dim) continue;
        const float u = detail::norm_product(norm_weight_at(p, j0 + w), g[w]);
        part[w] += detail::norm_product(u, detail::norm_normalized(x[w], s));
        part_u[w] += u;
      }
    }
    const float c = detail::rms_backward_factor(reduce(part), dim, s.rstd);
    const float e = layer ? detail::rms_backward_factor(reduce(part_u), dim, s.rstd) : 0.0f;
    if (n < p.rows.rows && lane == 0) {
      stats[n] = RowStats{s.mean, s.rstd, good ? 1 : 0};
    }
    if (!good) continue;

    // dx: two float4 stores per lane and step where the lane's 8 elements are whole and
    // aligned, else scalar ones.
    float* out = dx + n * dim;
    for (std::int64_t j0 = lane * kWidth; j0 < dim; j0 += kLanes * kWidth) {
      float g[kWidth], gp[kWidth], result[kWidth];
      pre(j0);
      load_lane_values(p.rows.out, p.rows.dtype, r.out_offset, j0, dim, g);
      if (p.grad_pre_norm != nullptr) {
        load_lane_values(p.grad_pre_norm, p.grad_pre_norm_dtype, r.grad_pre_norm_offset, j0, dim,
                         gp);
      } else {
#pragma unroll
        for (int w = 0; w < kWidth; ++w) gp[w] = 0.0f;
      }
#pragma unroll
      for (int w = 0; w < kWidth; ++w) {
        const float u = detail::norm_product(norm_weight_at(p, j0 + w < dim ? j0 + w : 0), g[w]);
        result[w] =
            detail::norm_backward_value(u, detail::norm_normalized(x[w], s), s.rstd, c, e, gp[w]);
      }
      if (j0 + kWidth <= dim && reinterpret_cast<std::uintptr_t>(out + j0) % 16 == 0) {
#pragma unroll
        for (int c4 = 0; c4 < kWidth; c4 += 4) {
          *reinterpret_cast<float4*>(out + j0 + c4) =
              make_float4(result[c4], result[c4 + 1], result[c4 + 2], result[c4 + 3]);
        }
      } else {
        for (int w = 0; w < kWidth && j0 + w < dim; ++w) out[j0 + w] = result[w];
      }
    }
  }
}

// N2, one column j of one chunk: the chunk's partial sums of g_j * xhat_j (weight) and g_j
// (bias) over its good rows [chunk * kWeightGradRows, end), in row order, into
// weight_partials / bias_partials [chunks, D] (null: not requested).
__device__ void norm_partials_column(const Params& p, const RowStats* stats, std::int64_t chunk,
                                     std::int64_t end, std::int64_t j, float* weight_partials,
                                     float* bias_partials) {
  const std::int64_t dim = p.rows.dim;
  float weight_sum = 0.0f, bias_sum = 0.0f;
  for (std::int64_t n = chunk * detail::kWeightGradRows; n < end; ++n) {
    const RowStats rs = stats[n];
    if (rs.good == 0) continue;
    std::int64_t offsets[internal::RowIndex::count];
    internal::row_offsets(p.rows.index, n, offsets);
    const float x = internal::load_vector_value(p.pre_norm, p.pre_norm_dtype,
                                                offsets[internal::RowIndex::pre_norm_out] + j);
    const float g =
        internal::load_vector_value(p.rows.out, p.rows.dtype, offsets[internal::RowIndex::out] + j);
    weight_sum +=
        detail::norm_product(g, detail::norm_normalized(x, detail::NormStats{rs.mean, rs.rstd}));
    bias_sum += g;
  }
  if (weight_partials != nullptr) weight_partials[chunk * dim + j] = weight_sum;
  if (bias_partials != nullptr) bias_partials[chunk * dim + j] = bias_sum;
}

// N2. A block per (chunk, 256 columns), columns striding over grid.y, which holds at most
// 65,535 blocks (past 16.7M columns a thread takes several).
__global__ void __launch_bounds__(256)
    norm_partials_kernel(const __grid_constant__ Params p, const RowStats* stats,
                         float* weight_partials, float* bias_partials) {
  const std::int64_t chunk = blockIdx.x;
  const std::int64_t end = min(p.rows.rows, (chunk + 1) * detail::kWeightGradRows);
  for (std::int64_t j = blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       j < p.rows.dim; j += static_cast<std::int64_t>(gridDim.y) * blockDim.x) {
    norm_partials_column(p, stats, chunk, end, j, weight_partials, bias_partials);
  }
}

// N3. A thread per column, striding over the grid (grid_for caps it): the chunk partials in
// order (0 chunks: 0).
__global__ void __launch_bounds__(256) norm_gradients_kernel(std::int64_t dim, std::int64_t chunks,
                                                             const float* partials, float* grad) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < dim;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partials[chunk * dim + j];
    grad[j] = sum;
  }
}

// --------------------------------------------------------------------- atomic mode ----

// One warp per grad_out row: weight * row added into each float32 gradient row. A lane takes
// kAtomicUnroll elements of the row per step, element base + 32 u + lane for u < kAtomicUnroll
// (16 bytes of T), all loaded before the first add, so that each warp-wide atomicAdd covers 32
// consecutive floats: 4 sectors (5 where the gradient row is not on 32 bytes). With a lane's
// 16-byte chunk of consecutive elements each one touched 16 sectors for 8 bytes of each
// (float32 grad_out) or 32 for 4 (16-bit; in the memory model; an H100 and an H200 ran the
// atomic gradient at 14-17% of a copy). sm_90's vector atomics
// would cover the same sectors; the coalesced scalar form needs no alignment and runs on the
// emulated device, which has no vector atomics.
template <typename T>
constexpr int kAtomicUnroll = kVec16<T>;
template <typename T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    atomic_kernel(const __grid_constant__ Params p) {
  constexpr int kUnroll = kAtomicUnroll<T>;
  const std::int64_t dim = p.rows.dim;
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  const int lane = threadIdx.x;
  const std::int64_t warp_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.y;
       n < p.rows.rows; n += warp_stride) {
    const internal::BackwardRow b = internal::resolve_backward_row(p, n);
    if (b.bad_key != internal::kNoBadIndex) {
      if (lane == 0) report_bad_row(p.rows.bad, b.bad_key);
      continue;
    }
    const T* row = grad_out + b.out_offset;
    for (std::int64_t base = lane; base < dim; base += 32 * kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t j = base + 32 * u;
        v[u] = j < dim ? to_float(row[j]) : 0.0f;
      }
#pragma unroll
      for (int t = 0; t < Params::count; ++t) {
        const internal::GradTable& g = p.targets[t];
        if (b.target[t] < 0) continue;
        float* dst = static_cast<float*>(g.grad) + b.target[t] * g.stride;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const std::int64_t j = base + 32 * u;
          if (j < dim) atomicAdd(dst + j, __fmul_rn(g.weight, v[u]));
        }
      }
    }
  }
  if (last_block_done(p.rows.bad)) describe_bad_row(p);
}

// ------------------------------------------------------------------------ host side ----

// The vector path needs D, grad_out's row starts and every gradient's row starts in whole
// chunks of W elements (16 bytes of T; W * sizeof(G) bytes of a gradient of dtype G).
template <typename T>
bool fits_vector_path(const Params& p) {
  constexpr std::int64_t w = kVec16<T>;
  if (p.rows.dim % w != 0 || !is_aligned(p.rows.out, 16)) return false;
  for (int d = 0; d < p.rows.index.ndim; ++d) {
    if (p.rows.index.stride[internal::RowIndex::out][d] % w != 0) return false;
  }
  for (const internal::GradTable& g : p.targets) {
    if (g.grad == nullptr) continue;
    if (!is_aligned(g.grad, static_cast<std::size_t>(w * dtype_size(g.dtype))) ||
        g.stride % w != 0) {
      return false;
    }
  }
  return true;
}

bool uses_atomics(const Params& p) {
  if (p.mode != BackwardMode::atomic) return false;
  for (const internal::GradTable& g : p.targets) {
    if (g.grad != nullptr && g.dtype != DType::float32) return false;
  }
  return true;
}

[[noreturn]] void too_large(const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "embed_backward: " + what);
}

KeyLayout key_layout(const Params& p) {
  KeyLayout l;
  std::uint64_t next = 0;
  for (int t = 0; t < Params::count; ++t) {
    if (p.targets[t].grad == nullptr) continue;
    l.slot_target[l.slots++] = t;
    l.base[t] = static_cast<std::uint32_t>(next);
    next += static_cast<std::uint64_t>(p.targets[t].rows);
    if (next >= UINT32_MAX) {
      too_large(
          fmt::format("the gradient tables have {} rows or more; the CUDA deterministic "
                      "mode supports fewer than 2^32 - 1 in all",
                      next));
    }
  }
  l.sentinel = static_cast<std::uint32_t>(next);
  l.end_bit = 1;
  while (l.end_bit < 32 && (std::uint64_t{1} << l.end_bit) <= next) ++l.end_bit;
  l.rows = p.rows.rows;
  const std::int64_t items = p.rows.rows * l.slots;
  if (items > INT32_MAX) {
    too_large(
        fmt::format("{} rows times {} gradient tables exceed 2^31 - 1 sort items; split "
                    "the call",
                    p.rows.rows, l.slots));
  }
  l.items = static_cast<int>(items);
  // A run of L > kChunk rows has ceil(L / kChunk) < 2 L / kChunk chunks.
  l.max_chunks = static_cast<int>(2 * items / kChunk + 1);
  return l;
}

// The pieces of the deterministic workspace, carved from one workspace in this order.
struct Pieces {
  std::uint32_t* keys_in = nullptr;
  std::uint32_t* keys = nullptr;  // sorted
  std::int64_t* offsets_in = nullptr;
  std::int64_t* offsets = nullptr;  // sorted with the keys
  std::uint32_t* run_keys = nullptr;
  int* run_lengths = nullptr;
  int* run_starts = nullptr;
  int* chunks = nullptr;
  int* chunk_starts = nullptr;
  int* num_runs = nullptr;
  float* partials = nullptr;
  void* cub = nullptr;
  std::size_t cub_bytes = 0;
  std::size_t required_bytes = 0;
};

// Lays out the workspace at `base` (null: only sizes). The CUB sizes come from its size
// queries (null temporary storage), which launch nothing.
Pieces plan(const KeyLayout& l, std::int64_t dim, char* base, cudaStream_t stream) {
  Pieces w;
  const auto n = static_cast<std::size_t>(l.items);
  WorkspaceLayout layout(base);
  w.keys_in = layout.take<std::uint32_t>(n);
  w.keys = layout.take<std::uint32_t>(n);
  w.offsets_in = layout.take<std::int64_t>(n);
  w.offsets = layout.take<std::int64_t>(n);
  w.run_keys = layout.take<std::uint32_t>(n);
  w.run_lengths = layout.take<int>(n);
  w.run_starts = layout.take<int>(n);
  w.chunks = layout.take<int>(n);
  w.chunk_starts = layout.take<int>(n);
  w.num_runs = layout.take<int>(1);
  w.partials =
      layout.take<float>(static_cast<std::size_t>(l.max_chunks) * static_cast<std::size_t>(dim));

  std::size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, w.keys_in, w.keys, w.offsets_in,
                                        w.offsets, l.items, 0, l.end_bit, stream),
        "cub::DeviceRadixSort::SortPairs (size query)");
  check(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, w.keys, w.run_keys, w.run_lengths,
                                           w.num_runs, l.items, stream),
        "cub::DeviceRunLengthEncode::Encode (size query)");
  check(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, w.run_lengths, w.run_starts, l.items,
                                      stream),
        "cub::DeviceScan::ExclusiveSum (size query)");
  w.cub_bytes = std::max(sort_bytes, std::max(encode_bytes, scan_bytes));
  w.cub = layout.take_bytes(w.cub_bytes);
  w.required_bytes = layout.required_bytes();
  return w;
}

template <typename T, int W>
void launch_reductions(const Params& p, const KeyLayout& l, const Pieces& w, cudaStream_t stream) {
  const dim3 block(32, kWarpsPerBlock);
  partial_sums_kernel<T, W>
      <<<grid_for(l.max_chunks, kWarpsPerBlock, 32 * kWarpsPerBlock), block, 0, stream>>>(
          p, w.offsets, w.run_starts, w.run_lengths, w.chunks, w.chunk_starts, w.num_runs,
          w.partials);
  check_launch("partial_sums_kernel");
  reduce_runs_kernel<T, W>
      <<<grid_for(l.items, kWarpsPerBlock, 32 * kWarpsPerBlock), block, 0, stream>>>(
          p, l, w.offsets, w.run_keys, w.run_starts, w.run_lengths, w.chunks, w.chunk_starts,
          w.num_runs, w.partials);
  check_launch("reduce_runs_kernel");
}

template <typename T>
void deterministic(const Params& p, cudaStream_t stream) {
  const KeyLayout l = key_layout(p);
  const Workspace workspace(p.workspace, plan(l, p.rows.dim, nullptr, stream).required_bytes,
                            stream, "embed_backward");
  const Pieces w = plan(l, p.rows.dim, workspace.base(), stream);

  keys_kernel<<<grid_for(l.items, 256, 256), 256, 0, stream>>>(p, l, w.keys_in, w.offsets_in);
  check_launch("keys_kernel");
  std::size_t bytes = w.cub_bytes;
  check(cub::DeviceRadixSort::SortPairs(w.cub, bytes, w.keys_in, w.keys, w.offsets_in, w.offsets,
                                        l.items, 0, l.end_bit, stream),
        "cub::DeviceRadixSort::SortPairs");
  // Encode writes only the first num_runs lengths; the scan reads all of them.
  check(cudaMemsetAsync(w.run_lengths, 0, static_cast<std::size_t>(l.items) * sizeof(int), stream),
        "cudaMemsetAsync");
  bytes = w.cub_bytes;
  check(cub::DeviceRunLengthEncode::Encode(w.cub, bytes, w.keys, w.run_keys, w.run_lengths,
                                           w.num_runs, l.items, stream),
        "cub::DeviceRunLengthEncode::Encode");
  bytes = w.cub_bytes;
  check(cub::DeviceScan::ExclusiveSum(w.cub, bytes, w.run_lengths, w.run_starts, l.items, stream),
        "cub::DeviceScan::ExclusiveSum (runs)");
  count_chunks_kernel<<<grid_for(l.items, 256, 256), 256, 0, stream>>>(l, w.run_keys, w.run_lengths,
                                                                       w.num_runs, w.chunks);
  check_launch("count_chunks_kernel");
  bytes = w.cub_bytes;
  check(cub::DeviceScan::ExclusiveSum(w.cub, bytes, w.chunks, w.chunk_starts, l.items, stream),
        "cub::DeviceScan::ExclusiveSum (chunks)");
  if (fits_vector_path<T>(p)) {
    launch_reductions<T, kVec16<T>>(p, l, w, stream);
  } else {
    launch_reductions<T, 1>(p, l, w, stream);
  }
}

template <typename T>
void atomic(const Params& p, cudaStream_t stream) {
  const dim3 block(32, kWarpsPerBlock);
  const unsigned grid = grid_for(p.rows.rows, kWarpsPerBlock, 32 * kWarpsPerBlock);
  atomic_kernel<T><<<grid, block, 0, stream>>>(p);
  check_launch("atomic_kernel");
}

template <typename T>
void run(const Params& p, cudaStream_t stream) {
  if (uses_atomics(p)) {
    atomic<T>(p, stream);
  } else {
    deterministic<T>(p, stream);
  }
}

// Bytes of workspace the tables' pass needs (without a norm: the whole call's).
std::size_t tables_workspace_size(const Params& p) {
  if (uses_atomics(p) || p.rows.rows == 0) return 0;
  return plan(key_layout(p), p.rows.dim, nullptr, cudaStream_t{}).required_bytes;
}

// The pieces of the norm's workspace, before the tables' pass's own.
struct NormPieces {
  float* dx = nullptr;
  RowStats* stats = nullptr;
  float* weight_partials = nullptr;
  float* bias_partials = nullptr;
  std::size_t required_bytes = 0;
  std::size_t used_bytes = 0;  // from the aligned base: where the tables' pass's pieces start
};

NormPieces plan_norm(const Params& p, char* base) {
  const auto rows = static_cast<std::size_t>(p.rows.rows);
  const auto dim = static_cast<std::size_t>(p.rows.dim);
  const auto partials = static_cast<std::size_t>(detail::weight_grad_chunks(p.rows.rows)) * dim;
  NormPieces w;
  WorkspaceLayout layout(base);
  w.dx = layout.take<float>(rows * dim);
  w.stats = layout.take<RowStats>(rows);
  if (p.grad_norm_weight != nullptr) w.weight_partials = layout.take<float>(partials);
  if (p.grad_norm_bias != nullptr) w.bias_partials = layout.take<float>(partials);
  w.required_bytes = layout.required_bytes();
  w.used_bytes = layout.used_bytes();
  return w;
}

// embed_backward with a norm: N1-N3, then the tables' pass over dx.
void run_with_norm(const Params& p, cudaStream_t stream) {
  const std::size_t norm_bytes = plan_norm(p, nullptr).required_bytes;
  Params tables = internal::norm_scatter_params(p, nullptr);
  const std::size_t tables_bytes = tables_workspace_size(tables);
  const Workspace workspace(p.workspace, norm_bytes + tables_bytes, stream, "embed_backward");
  const NormPieces w = plan_norm(p, workspace.base());
  const std::int64_t dim = p.rows.dim;
  const std::int64_t chunks = detail::weight_grad_chunks(p.rows.rows);
  if (p.rows.rows > 0) {
    norm_rows_kernel<<<grid_for(p.rows.rows, kNormBlockRows, detail::kNormLanes * kNormBlockRows),
                       dim3(detail::kNormLanes, kNormBlockRows), 0, stream>>>(p, w.dx, w.stats);
    check_launch("norm_rows_kernel");
    if (w.weight_partials != nullptr || w.bias_partials != nullptr) {
      if (chunks > INT32_MAX) too_large("too many rows for the norm's gradients");
      const dim3 grid(static_cast<unsigned>(chunks),
                      static_cast<unsigned>(std::min<std::int64_t>((dim + 255) / 256, 65535)));
      norm_partials_kernel<<<grid, 256, 0, stream>>>(p, w.stats, w.weight_partials,
                                                     w.bias_partials);
      check_launch("norm_partials_kernel");
    }
  }
  for (auto [partials, grad] : {std::pair{w.weight_partials, p.grad_norm_weight},
                                std::pair{w.bias_partials, p.grad_norm_bias}}) {
    if (grad == nullptr) continue;
    norm_gradients_kernel<<<grid_for(dim, 256, 256), 256, 0, stream>>>(dim, chunks, partials, grad);
    check_launch("norm_gradients_kernel");
  }
  if (p.rows.rows == 0) return;
  tables = internal::norm_scatter_params(p, w.dx);
  // After the norm's pieces, still aligned; the tables' pass needs at most tables_bytes from
  // there, and base() + used_bytes + tables_bytes lies within the norm_bytes + tables_bytes
  // the call has (base() is at most kWorkspaceAlign - 1 bytes past the memory's start).
  tables.workspace = tables_bytes == 0 ? nullptr : workspace.base() + w.used_bytes;
  tables.workspace_bytes = tables_bytes;
  run<float>(tables, stream);
}

}  // namespace

void embed_backward(const internal::EmbedBackwardParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  if (p.rows.norm != Normalization::none) {
    run_with_norm(p, to_cuda(stream));
    return;
  }
  internal::dispatch_value_dtype(
      p.rows.dtype, [&](auto t) { run<typename decltype(t)::type>(p, to_cuda(stream)); });
}

std::size_t embed_backward_workspace_size(const internal::EmbedBackwardParams& p, Device device) {
  DeviceGuard guard(device);
  if (p.rows.norm != Normalization::none) {
    return plan_norm(p, nullptr).required_bytes +
           tables_workspace_size(internal::norm_scatter_params(p, nullptr));
  }
  return tables_workspace_size(p);
}

}  // namespace embrope::gpu
