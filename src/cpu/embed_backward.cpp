// embed_backward on the CPU, threaded with OpenMP and deterministic. For each gradient table:
// the rows that map to it are sorted by (table row, grad_out row) (a stable sort of row
// indices by table row), which groups them into runs, one per table row, in ascending
// grad_out order. Tasks are (run, column block) pairs: a thread sums its run's rows for its
// columns in the order of detail::kEmbedBackwardChunk (chunks summed from zero, then added in
// order) and writes that part of the table row once. Each element's sum is therefore formed
// in one fixed order whatever the number of threads, the same order as the GPU's
// deterministic mode.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "../embed_row.hpp"
#include "embrope/detail/embed_backward_math.hpp"
#include "embrope/detail/numeric_types.hpp"

namespace embrope::cpu {
namespace {

using detail::from_float;
using detail::to_float;
using Params = detail::EmbedBackwardParams;

constexpr std::int64_t kColumns = 256;  // columns per task: two 1 KiB float32 accumulators

// Adds the runs of one gradient table. order: grad_out rows sorted by table row; run_start:
// the start of each run in order (and order.size() at the end); keys: the table row of each
// grad_out row.
template <typename T, typename G>
void reduce_runs(const Params& p, const detail::GradTable& target,
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

template <typename T>
void embed_backward_kernel(const Params& p) {
  const std::int64_t rows = p.rows.rows;
  const bool threaded = rows * p.rows.dim >= (1 << 15);
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> keys[Params::count];
  for (int t = 0; t < Params::count; ++t) {
    if (p.targets[t].grad != nullptr) keys[t].resize(static_cast<std::size_t>(rows));
  }
  std::int64_t first_bad = detail::kNoBadIndex;

#pragma omp parallel for schedule(static) reduction(min : first_bad) if (threaded)
  for (std::int64_t n = 0; n < rows; ++n) {
    const detail::BackwardRow b = detail::resolve_backward_row(p, n);
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
    if (p.targets[t].dtype == DType::float32) {
      reduce_runs<T, float>(p, p.targets[t], order, run_start, key, offsets, threaded);
    } else {
      reduce_runs<T, T>(p, p.targets[t], order, run_start, key, offsets, threaded);
    }
  }

  detail::lower_bad_index(
      p.rows.bad, first_bad, detail::BadIndexOp::embed_backward, [&](std::int64_t key) {
        return detail::resolve_embed_row(p.rows, detail::bad_index_row(key)).bad;
      });
}

}  // namespace

void embed_backward(const detail::EmbedBackwardParams& p) {
  detail::dispatch_value_dtype(
      p.rows.dtype, [&](auto t) { embed_backward_kernel<typename decltype(t)::type>(p); });
}

}  // namespace embrope::cpu
