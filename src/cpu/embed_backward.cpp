// embed_backward on the CPU, threaded with OpenMP and deterministic. For each gradient table:
// the rows that map to it are sorted by (table row, grad_out row) (a stable sort of row
// indices by table row), which groups them into runs, one per table row, in ascending
// grad_out order. Each run is summed in the order of detail::kEmbedBackwardChunk (chunks
// summed from zero, then added in order) and its table row written once: a run of one chunk
// or less by one thread along the whole row (reduce_runs), a longer one by chunks across the
// threads and then by column blocks (reduce_long_runs). Each element's sum is therefore formed
// in one fixed order whatever the number of threads, the same order as the GPU's
// deterministic mode.
//
// With embed's norm, the norm's backward runs first (norm_backward): the rows, in chunks of
// detail::kWeightGradRows, each row's dx written as float32 to a scratch [rows, D] and its
// terms of the norm's weight and bias gradients summed into the chunk's partials, which are
// then summed in chunk order (detail/norm_math.hpp). The tables' pass then reads dx in the
// place of grad_out.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "../embed_row.hpp"
#include "embrope/detail/embed_backward_math.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "per_thread.hpp"
#include "simd.hpp"

namespace embrope::cpu {
namespace {

using detail::from_float;
using detail::to_float;
using Params = internal::EmbedBackwardParams;

constexpr std::int64_t kColumns = 256;  // columns per block: two 1 KiB float32 accumulators

// A run of more rows than this (a frequent token's) is summed by chunks across the threads
// (reduce_long_runs); a shorter one by one thread, block after block along its row.
constexpr std::int64_t kLongRun = detail::kEmbedBackwardChunk;

// Source rows of the next run asked for ahead (a short run's first few).
constexpr std::int64_t kAheadRows = 4;

// The runs of one gradient table. order: grad_out rows sorted by table row; start: the start
// of each run in order (and order.size() at the end); keys: the table row of each grad_out
// row; offsets: each grad_out row's element offset.
struct Runs {
  const std::vector<std::int64_t>& order;
  const std::vector<std::int64_t>& start;
  const std::vector<std::int64_t>& keys;
  const std::vector<std::int64_t>& offsets;
};

// The lines of one run's gradient row and first source rows that the block of columns
// [j0, j0 + width) reads, asked for in L2 a run ahead: the rows lie at random addresses, where
// the hardware prefetchers restart at every row and so never reach the stream of a copy.
template <typename T, typename G>
struct RunAhead {
  G* out = nullptr;  // null: nothing to ask for
  const T* sources[kAheadRows] = {};
  std::int64_t count = 0;
};

template <typename T, typename G>
RunAhead<T, G> run_ahead(const Runs& runs, std::int64_t r, const T* grad_out, G* grad,
                         std::int64_t stride) {
  RunAhead<T, G> ahead;
  const std::int64_t begin = runs.start[r];
  ahead.out = grad + runs.keys[runs.order[begin]] * stride;
  ahead.count = std::min(kAheadRows, runs.start[r + 1] - begin);
  for (std::int64_t i = 0; i < ahead.count; ++i) {
    ahead.sources[i] = grad_out + runs.offsets[runs.order[begin + i]];
  }
  return ahead;
}

template <typename T, typename G>
void prefetch_block(const RunAhead<T, G>& ahead, std::int64_t j0, std::int64_t width) {
  constexpr auto kOut = static_cast<std::int64_t>(sizeof(G));
  constexpr auto kIn = static_cast<std::int64_t>(sizeof(T));
  prefetch_lines<1>(ahead.out, j0 * kOut, (j0 + width) * kOut);
  for (std::int64_t i = 0; i < ahead.count; ++i) {
    prefetch_lines(ahead.sources[i], j0 * kIn, (j0 + width) * kIn);
  }
}

// sum[j] += row[j] over [0, width), in float32.
template <typename T>
void add_row(float* __restrict sum, const T* __restrict row, std::int64_t width) {
#pragma omp simd
  for (std::int64_t j = 0; j < width; ++j) sum[j] += to_float(row[j]);
}

// out[j] = out[j] + weight * sum[j] over [0, width) (detail::accumulate_gradient).
template <typename G>
void add_to_gradient(G* out, const float* sum, std::int64_t width, float weight) {
#pragma omp simd
  for (std::int64_t j = 0; j < width; ++j) {
    out[j] = from_float<G>(detail::accumulate_gradient(to_float(out[j]), sum[j], weight));
  }
}

// Sums run r's rows over columns [j0, j0 + width) in the order of detail::kEmbedBackwardChunk
// and adds the sum to its gradient row; then asks for the same block of `next` (if any).
template <typename T, typename G>
void reduce_block(const Params& p, const internal::GradTable& target, const Runs& runs,
                  std::int64_t r, std::int64_t j0, std::int64_t width, const RunAhead<T, G>& next) {
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  const std::int64_t* order = runs.order.data();
  const std::int64_t* offsets = runs.offsets.data();
  const std::int64_t begin = runs.start[r];
  const std::int64_t end = runs.start[r + 1];
  float total[kColumns];
  float part[kColumns];
  std::fill(total, total + width, 0.0f);
  for (std::int64_t c = begin; c < end; c += detail::kEmbedBackwardChunk) {
    std::fill(part, part + width, 0.0f);
    const std::int64_t chunk_end = std::min(end, c + detail::kEmbedBackwardChunk);
    for (std::int64_t i = c; i < chunk_end; ++i) {
      add_row(part, grad_out + offsets[order[i]] + j0, width);
    }
    add_row(total, part, width);
  }
  if (next.out != nullptr) prefetch_block(next, j0, width);
  add_to_gradient(static_cast<G*>(target.grad) + runs.keys[order[begin]] * target.stride + j0,
                  total, width, target.weight);
}

// Adds the long runs (more than one chunk of rows) of one gradient table: a task per chunk
// sums the chunk's rows, from zero and in row order, into the chunk's partial row (each row
// read from its start, as a copy streams, with the chunk's next row asked for ahead), then a
// task per (run, column block) adds the run's partials in chunk order from zero and the total
// to the gradient row: the order of detail::kEmbedBackwardChunk. The partials take one
// float32 row per chunk: less than 1/8 of the bytes of a bfloat16 grad_out's rows in long runs
// (1/16 of a float32's). With one id on every row of 16K rows of D 4096, against tasks of one
// column block over all rows (2 threads): 3.9-5.2x (bfloat16), 2.4-3.1x (float32); of that,
// the next row asked for ahead gave 1.1-1.2x, and with Zipf's ids (35% of the rows in long
// runs) up to 1.2x (benchmarks/results/cpu-2026-12-07-embed-backward-runs/).
template <typename T, typename G>
void reduce_long_runs(const Params& p, const internal::GradTable& target, const Runs& runs,
                      const std::vector<std::int64_t>& long_runs, bool threaded) {
  const std::int64_t dim = p.rows.dim;
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  const std::int64_t* order = runs.order.data();
  const std::int64_t* offsets = runs.offsets.data();
  const auto longs = static_cast<std::int64_t>(long_runs.size());
  constexpr auto kIn = static_cast<std::int64_t>(sizeof(T));
  // first_chunk[i]: the first chunk of long run i (and the number of chunks at the end);
  // chunk k: order[chunk_begin[k], chunk_end[k]).
  std::vector<std::int64_t> first_chunk(static_cast<std::size_t>(longs + 1), 0);
  std::vector<std::int64_t> chunk_begin, chunk_end;
  for (std::int64_t i = 0; i < longs; ++i) {
    first_chunk[i] = static_cast<std::int64_t>(chunk_begin.size());
    const std::int64_t end = runs.start[long_runs[i] + 1];
    for (std::int64_t c = runs.start[long_runs[i]]; c < end; c += detail::kEmbedBackwardChunk) {
      chunk_begin.push_back(c);
      chunk_end.push_back(std::min(end, c + detail::kEmbedBackwardChunk));
    }
  }
  const auto chunks = static_cast<std::int64_t>(chunk_begin.size());
  first_chunk[longs] = chunks;
  // A partial row per chunk, each starting a cache line (rows written by different threads
  // share none). Not value-initialised: each chunk's task zeroes its own row.
  constexpr std::int64_t kLineFloats = 16;
  const std::int64_t pitch = (dim + kLineFloats - 1) / kLineFloats * kLineFloats;
  const std::unique_ptr<float[]> storage(
      new float[static_cast<std::size_t>(chunks * pitch + kLineFloats)]);
  const std::uintptr_t misaligned = reinterpret_cast<std::uintptr_t>(storage.get()) % 64;
  float* const partials =
      storage.get() + (misaligned == 0 ? 0 : kLineFloats - misaligned / sizeof(float));

#pragma omp parallel for schedule(dynamic, 1) if (threaded)
  for (std::int64_t k = 0; k < chunks; ++k) {
    float* part = partials + k * pitch;
    std::fill(part, part + dim, 0.0f);
    // Block by block, each with the same block of the chunk's next row asked for ahead: the
    // rows of a frequent id lie at random places in grad_out.
    for (std::int64_t i = chunk_begin[k]; i < chunk_end[k]; ++i) {
      const T* row = grad_out + offsets[order[i]];
      const T* next = i + 1 < chunk_end[k] ? grad_out + offsets[order[i + 1]] : nullptr;
      for (std::int64_t j0 = 0; j0 < dim; j0 += kColumns) {
        const std::int64_t width = std::min(kColumns, dim - j0);
        if (next != nullptr) prefetch_lines(next, j0 * kIn, (j0 + width) * kIn);
        add_row(part + j0, row + j0, width);
      }
    }
  }

  const std::int64_t blocks = (dim + kColumns - 1) / kColumns;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (threaded)
  for (std::int64_t i = 0; i < longs; ++i) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t j0 = b * kColumns;
      const std::int64_t width = std::min(kColumns, dim - j0);
      float total[kColumns];
      std::fill(total, total + width, 0.0f);
      for (std::int64_t k = first_chunk[i]; k < first_chunk[i + 1]; ++k) {
        add_row(total, partials + k * pitch + j0, width);
      }
      add_to_gradient(static_cast<G*>(target.grad) +
                          runs.keys[order[runs.start[long_runs[i]]]] * target.stride + j0,
                      total, width, target.weight);
    }
  }
}

// Adds the runs of one gradient table. Each short run is one task: a thread takes consecutive
// short runs, each whole (block after block), and with each block of one asks for the same
// block of its next (one run ahead), unless that run starts another thread's share. At 16K
// random ids of a 128,256-row vocabulary (D 4096, bfloat16 into float32, 2 threads; 638 MB,
// DRAM), against tasks of one column block each with nothing asked for ahead: 1.4x from whole
// runs (the hardware prefetchers follow a row), 1.5x more from the next run's lines
// (benchmarks/results/cpu-2026-12-07-embed-backward-runs/).
template <typename T, typename G>
void reduce_runs(const Params& p, const internal::GradTable& target, const Runs& runs,
                 bool threaded) {
  const std::int64_t dim = p.rows.dim;
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  auto* grad = static_cast<G*>(target.grad);
  const auto count = static_cast<std::int64_t>(runs.start.size()) - 1;
  std::vector<std::int64_t> short_runs, long_runs;
  for (std::int64_t r = 0; r < count; ++r) {
    (runs.start[r + 1] - runs.start[r] > kLongRun ? long_runs : short_runs).push_back(r);
  }
  const auto shorts = static_cast<std::int64_t>(short_runs.size());
  constexpr std::int64_t kRunsPerShare = 16;  // consecutive short runs a thread takes at once
#pragma omp parallel for schedule(dynamic, kRunsPerShare) if (threaded)
  for (std::int64_t i = 0; i < shorts; ++i) {
    const bool next_is_mine = (i + 1) % kRunsPerShare != 0 && i + 1 < shorts;
    const RunAhead<T, G> next =
        next_is_mine ? run_ahead(runs, short_runs[i + 1], grad_out, grad, target.stride)
                     : RunAhead<T, G>{};
    for (std::int64_t j0 = 0; j0 < dim; j0 += kColumns) {
      reduce_block(p, target, runs, short_runs[i], j0, std::min(kColumns, dim - j0), next);
    }
  }
  if (!long_runs.empty()) reduce_long_runs<T, G>(p, target, runs, long_runs, threaded);
}

// A row of `dim` float32, float16 or bfloat16 values at `base` + `offset`, as float32.
void load_row(const void* base, DType dtype, std::int64_t offset, std::int64_t dim, float* to) {
  internal::dispatch_value_dtype(dtype, [&](auto t) {
    const auto* from = static_cast<const typename decltype(t)::type*>(base) + offset;
#pragma omp simd
    for (std::int64_t j = 0; j < dim; ++j) to[j] = to_float(from[j]);
  });
}

// The norm's backward of one good row into dx[0, D) (float32); its terms of the weight and
// bias gradients are added to weight_partial and bias_partial (null: not requested).
// weight: the weight factors w_j (or 1 + w_j); scratch: 3 D floats.
void norm_backward_row(const Params& p, const internal::EmbedRow& r, const float* weight,
                       float* scratch, float* dx, float* weight_partial, float* bias_partial) {
  const std::int64_t dim = p.rows.dim;
  float* x = scratch;  // the pre-norm row, then xhat
  float* g = scratch + dim;
  float* u = scratch + 2 * dim;
  load_row(p.pre_norm, p.pre_norm_dtype, r.pre_norm_offset, dim, x);
  load_row(p.rows.out, p.rows.dtype, r.out_offset, dim, g);
  const bool layer = p.rows.norm == Normalization::layer_norm;
  const detail::NormStats stats = detail::row_norm_stats(x, dim, layer, p.rows.norm_eps);
  for (std::int64_t j = 0; j < dim; ++j) {
    x[j] = detail::norm_normalized(x[j], stats);
    u[j] = detail::norm_product(weight[j], g[j]);
  }
  const float c = detail::rms_backward_factor(
      detail::canonical_row_sum(dim,
                                [&](std::int64_t j) { return detail::norm_product(u[j], x[j]); }),
      dim, stats.rstd);
  const float e = layer ? detail::rms_backward_factor(
                              detail::canonical_row_sum(dim, [&](std::int64_t j) { return u[j]; }),
                              dim, stats.rstd)
                        : 0.0f;
  if (p.grad_pre_norm != nullptr) {
    load_row(p.grad_pre_norm, p.grad_pre_norm_dtype, r.grad_pre_norm_offset, dim, dx);
  } else {
    std::fill(dx, dx + dim, 0.0f);
  }
  for (std::int64_t j = 0; j < dim; ++j) {
    dx[j] = detail::norm_backward_value(u[j], x[j], stats.rstd, c, e, dx[j]);
  }
  if (weight_partial != nullptr) {
    for (std::int64_t j = 0; j < dim; ++j) weight_partial[j] += detail::norm_product(g[j], x[j]);
  }
  if (bias_partial != nullptr) {
    for (std::int64_t j = 0; j < dim; ++j) bias_partial[j] += g[j];
  }
}

// dx of every row into `dx` ([rows, D] float32; bad rows are left as they are: the tables'
// pass skips them), and the norm's weight and bias gradients (overwritten).
void norm_backward(const Params& p, float* dx) {
  const std::int64_t rows = p.rows.rows;
  const std::int64_t dim = p.rows.dim;
  std::vector<float> weight(static_cast<std::size_t>(dim), 1.0f);
  if (p.rows.norm_weight != nullptr) {
    for (std::int64_t j = 0; j < dim; ++j) {
      weight[j] = detail::norm_weight_factor(
          internal::load_vector_value(p.rows.norm_weight, p.rows.norm_weight_dtype, j),
          p.rows.norm_unit_offset);
    }
  }
  const std::int64_t chunks = detail::weight_grad_chunks(rows);
  const auto partial_floats = static_cast<std::size_t>(chunks * dim);
  std::vector<float> weight_partials(p.grad_norm_weight != nullptr ? partial_floats : 0, 0.0f);
  std::vector<float> bias_partials(p.grad_norm_bias != nullptr ? partial_floats : 0, 0.0f);
  const bool threaded = rows * dim >= (1 << 15);
  PerThread<std::vector<float>> scratches(threaded, static_cast<std::size_t>(3 * dim));
#pragma omp parallel num_threads(scratches.threads()) if (threaded)
  {
    std::vector<float>& scratch = scratches.mine();
#pragma omp for schedule(static)
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      float* wp = weight_partials.empty() ? nullptr : weight_partials.data() + chunk * dim;
      float* bp = bias_partials.empty() ? nullptr : bias_partials.data() + chunk * dim;
      const std::int64_t end = std::min(rows, (chunk + 1) * detail::kWeightGradRows);
      for (std::int64_t n = chunk * detail::kWeightGradRows; n < end; ++n) {
        const internal::EmbedRow r = internal::resolve_embed_row(p.rows, n);
        if (r.bad_key != internal::kNoBadIndex) continue;
        norm_backward_row(p, r, weight.data(), scratch.data(), dx + n * dim, wp, bp);
      }
    }
  }
  const std::pair<const std::vector<float>*, float*> sums[] = {
      {&weight_partials, p.grad_norm_weight}, {&bias_partials, p.grad_norm_bias}};
  for (const auto& sum_of : sums) {
    const float* partials = sum_of.first->data();
    float* grad = sum_of.second;
    if (grad == nullptr) continue;
#pragma omp parallel for schedule(static) if (threaded)
    for (std::int64_t j = 0; j < dim; ++j) {
      float sum = 0.0f;
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partials[chunk * dim + j];
      grad[j] = sum;
    }
  }
}

template <typename T>
void embed_backward_kernel(const Params& p) {
  const std::int64_t rows = p.rows.rows;
  const bool threaded = rows * p.rows.dim >= (1 << 15);
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> keys[Params::count];
  for (int t = 0; t < Params::count; ++t) {
    if (p.targets[t].grad != nullptr) keys[t].resize(static_cast<std::size_t>(rows));
  }
  std::int64_t first_bad = internal::kNoBadIndex;

#pragma omp parallel for schedule(static) reduction(min : first_bad) if (threaded)
  for (std::int64_t n = 0; n < rows; ++n) {
    const internal::BackwardRow b = internal::resolve_backward_row(p, n);
    offsets[n] = b.out_offset;
    for (int t = 0; t < Params::count; ++t) {
      if (!keys[t].empty()) keys[t][n] = b.target[t];
    }
    first_bad = std::min(first_bad, b.bad_key);
  }

  std::vector<std::int64_t> order, run_start;
  for (int t = 0; t < Params::count; ++t) {
    if (keys[t].empty()) continue;
    const std::vector<std::int64_t>& key = keys[t];
    order.clear();
    for (std::int64_t n = 0; n < rows; ++n) {
      if (key[n] >= 0) order.push_back(n);
    }
    // Stable: rows of one table row stay in ascending grad_out order.
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return key[a] < key[b]; });
    run_start.clear();
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || key[order[i]] != key[order[i - 1]]) {
        run_start.push_back(static_cast<std::int64_t>(i));
      }
    }
    run_start.push_back(static_cast<std::int64_t>(order.size()));
    // A gradient is float32 or grad_out's dtype, or any of the three after a norm (dx is
    // float32).
    internal::dispatch_value_dtype(p.targets[t].dtype, [&](auto g) {
      reduce_runs<T, typename decltype(g)::type>(p, p.targets[t],
                                                 Runs{order, run_start, key, offsets}, threaded);
    });
  }

  internal::lower_bad_index(
      p.rows.bad, first_bad, internal::BadIndexOp::embed_backward, [&](std::int64_t key) {
        return internal::resolve_embed_row(p.rows, internal::bad_index_row(key)).bad;
      });
}

}  // namespace

void embed_backward(const internal::EmbedBackwardParams& p) {
  if (p.rows.norm != Normalization::none) {
    std::vector<float> dx(static_cast<std::size_t>(p.rows.rows * p.rows.dim));
    norm_backward(p, dx.data());
    embed_backward_kernel<float>(internal::norm_scatter_params(p, dx.data()));
    return;
  }
  internal::dispatch_value_dtype(
      p.rows.dtype, [&](auto t) { embed_backward_kernel<typename decltype(t)::type>(p); });
}

}  // namespace embrope::cpu
