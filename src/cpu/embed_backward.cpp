// embed_backward on the CPU, threaded with OpenMP and deterministic. For each gradient table:
// the rows that map to it are sorted by (table row, grad_out row) (a stable sort of row
// indices by table row), which groups them into runs, one per table row, in ascending
// grad_out order. Tasks are (run, column block) pairs: a thread sums its run's rows for its
// columns in the order of detail::kEmbedBackwardChunk (chunks summed from zero, then added in
// order) and writes that part of the table row once. Each element's sum is therefore formed
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
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "../embed_row.hpp"
#include "embrope/detail/embed_backward_math.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"

namespace embrope::cpu {
namespace {

using detail::from_float;
using detail::to_float;
using Params = internal::EmbedBackwardParams;

constexpr std::int64_t kColumns = 256;  // columns per task: two 1 KiB float32 accumulators

// Adds the runs of one gradient table. order: grad_out rows sorted by table row; run_start:
// the start of each run in order (and order.size() at the end); keys: the table row of each
// grad_out row.
template <typename T, typename G>
void reduce_runs(const Params& p, const internal::GradTable& target,
                 const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& run_start,
                 const std::vector<std::int64_t>& keys, const std::vector<std::int64_t>& offsets,
                 bool threaded) {
  const std::int64_t dim = p.rows.dim;
  const auto* grad_out = static_cast<const T*>(p.rows.out);
  auto* grad = static_cast<G*>(target.grad);
  const auto runs = static_cast<std::int64_t>(run_start.size()) - 1;
  const std::int64_t blocks = (dim + kColumns - 1) / kColumns;

#pragma omp parallel for collapse(2) schedule(dynamic, 4) if (threaded)
  for (std::int64_t r = 0; r < runs; ++r) {
    for (std::int64_t cb = 0; cb < blocks; ++cb) {
      const std::int64_t j0 = cb * kColumns;
      const std::int64_t width = std::min(kColumns, dim - j0);
      float total[kColumns];
      float part[kColumns];
      std::fill(total, total + width, 0.0f);
      const std::int64_t begin = run_start[r];
      const std::int64_t end = run_start[r + 1];
      for (std::int64_t c = begin; c < end; c += detail::kEmbedBackwardChunk) {
        std::fill(part, part + width, 0.0f);
        const std::int64_t chunk_end = std::min(end, c + detail::kEmbedBackwardChunk);
        for (std::int64_t i = c; i < chunk_end; ++i) {
          const T* row = grad_out + offsets[order[i]] + j0;
#pragma omp simd
          for (std::int64_t j = 0; j < width; ++j) part[j] += to_float(row[j]);
        }
#pragma omp simd
        for (std::int64_t j = 0; j < width; ++j) total[j] += part[j];
      }
      G* out = grad + keys[order[begin]] * target.stride + j0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) {
        out[j] =
            from_float<G>(detail::accumulate_gradient(to_float(out[j]), total[j], target.weight));
      }
    }
  }
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
#pragma omp parallel if (threaded)
  {
    std::vector<float> scratch(static_cast<std::size_t>(3 * dim));
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
      reduce_runs<T, typename decltype(g)::type>(p, p.targets[t], order, run_start, key, offsets,
                                                 threaded);
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
