// embed on the CPU: one output row per iteration, threaded with OpenMP. The token row is
// scaled, then the positional row (learned, or sinusoidal after Vaswani et al. 2017) and the
// type row are added in float32, in that order, and the sum is rounded once.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "../embed_row.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/sinusoid.hpp"

namespace embrope::cpu {
namespace {

using detail::from_float;
using detail::to_float;

template <typename T>
void embed_kernel(const detail::EmbedParams& p) {
  const std::int64_t dim = p.dim;
  const auto* table = static_cast<const T*>(p.table);
  const auto* position_table = static_cast<const T*>(p.position_table);
  const auto* type_table = static_cast<const T*>(p.type_table);
  const bool sinusoidal = p.positions == PositionEncoding::sinusoidal;
  const bool plain = p.positions == PositionEncoding::none && type_table == nullptr;
  std::vector<double> freqs;
  if (sinusoidal) {
    freqs.resize(static_cast<std::size_t>(dim / 2));
    for (std::int64_t i = 0; i < dim / 2; ++i) {
      freqs[i] = detail::sinusoid_freq(i, dim, p.sinusoid_base);
    }
  }
  std::int64_t first_bad = detail::kNoBadIndex;
  const bool threaded = p.rows * dim >= (1 << 15);

#pragma omp parallel reduction(min : first_bad) if (threaded)
  {
    std::vector<float> acc(static_cast<std::size_t>(plain ? 0 : dim));
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < p.rows; ++n) {
      const detail::EmbedRow r = detail::resolve_embed_row(p, n);
      T* out = static_cast<T*>(p.out) + r.out_offset;
      if (r.bad_key != detail::kNoBadIndex) {
        std::fill(out, out + dim, from_float<T>(0.0f));
        first_bad = std::min(first_bad, r.bad_key);
        continue;
      }
      const T* token = table + r.token * p.table_stride;
      if (plain) {
        if (!r.token_hit) {
          std::fill(out, out + dim, from_float<T>(0.0f));
        } else if (p.scale == 1.0f) {
          std::memcpy(out, token, static_cast<std::size_t>(dim) * sizeof(T));
        } else {
#pragma omp simd
          for (std::int64_t j = 0; j < dim; ++j)
            out[j] = from_float<T>(p.scale * to_float(token[j]));
        }
        continue;
      }
      float* a = acc.data();
      if (r.token_hit) {
#pragma omp simd
        for (std::int64_t j = 0; j < dim; ++j) a[j] = p.scale * to_float(token[j]);
      } else {
        std::fill(a, a + dim, 0.0f);
      }
      if (position_table != nullptr) {
        const T* pos = position_table + r.position * p.position_table_stride;
#pragma omp simd
        for (std::int64_t j = 0; j < dim; ++j) a[j] += to_float(pos[j]);
      } else if (sinusoidal) {
        const std::int64_t half = dim / 2;
        const bool split = p.sinusoid_layout == SinusoidLayout::split;
        for (std::int64_t i = 0; i < half; ++i) {
          float s, c;
          detail::sinusoid_sin_cos(r.position, freqs[i], &s, &c);
          a[split ? i : 2 * i] += s;
          a[split ? half + i : 2 * i + 1] += c;
        }
      }
      if (type_table != nullptr) {
        const T* type = type_table + r.type * p.type_table_stride;
#pragma omp simd
        for (std::int64_t j = 0; j < dim; ++j) a[j] += to_float(type[j]);
      }
#pragma omp simd
      for (std::int64_t j = 0; j < dim; ++j) out[j] = from_float<T>(a[j]);
    }
  }

  detail::lower_bad_index(p.bad, first_bad, detail::BadIndexOp::embed, [&](std::int64_t key) {
    return detail::resolve_embed_row(p, detail::bad_index_row(key)).bad;
  });
}

}  // namespace

void embed(const detail::EmbedParams& p) {
  detail::dispatch_value_dtype(p.dtype,
                               [&](auto t) { embed_kernel<typename decltype(t)::type>(p); });
}

}  // namespace embrope::cpu
