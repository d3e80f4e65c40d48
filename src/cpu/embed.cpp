// embed on the CPU: one output row per iteration, threaded with OpenMP. The token row is
// scaled, then the positional row (learned, or sinusoidal after Vaswani et al. 2017) and the
// type row are added in float32, in that order, and the sum is rounded once. On x86, rows
// with a learned position, a type or a scale run the vector body (embed.inc, for AVX2 + F16C
// or AVX-512, chosen at run time by isa.hpp), with the portable path's bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "../embed_row.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/sinusoid.hpp"
#include "isa.hpp"

namespace embrope::cpu {

using detail::from_float;
using detail::to_float;

#define EMBROPE_VECTOR_BODY "embed.inc"
#include "vector_bodies.hpp"

namespace {

template <typename T>
struct VectorBody {  // embed.inc of one instruction set
  void (*sum_row)(const detail::EmbedParams&, const detail::EmbedRow&, T*, const double*, float*,
                  bool);
  void (*copy_row)(T*, const T*, std::int64_t, bool);
};

// vector: the vector body (embed.inc), or null (the portable loops).
template <typename T>
void embed_kernel(const detail::EmbedParams& p, const VectorBody<T>* vector) {
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
  // An output past 16 MiB will not stay in cache: write it with streaming stores (the vector
  // bodies; a copy then moves only the bytes it must, as memcpy does).
  const bool stream =
      p.rows * dim * static_cast<std::int64_t>(sizeof(T)) >= (std::int64_t{1} << 24);

#pragma omp parallel reduction(min : first_bad) if (threaded)
  {
    std::vector<float> acc(static_cast<std::size_t>(plain ? 0 : 2 * dim));
    // Dynamic chunks: a thread that shares its core with other work takes fewer rows.
#pragma omp for schedule(dynamic, 16)
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
          if (vector != nullptr) {
            vector->copy_row(out, token, dim, stream);
          } else {
            std::memcpy(out, token, static_cast<std::size_t>(dim) * sizeof(T));
          }
        } else if (vector != nullptr) {
          vector->sum_row(p, r, out, freqs.data(), nullptr, stream);
        } else {
#pragma omp simd
          for (std::int64_t j = 0; j < dim; ++j)
            out[j] = from_float<T>(p.scale * to_float(token[j]));
        }
        continue;
      }
      if (vector != nullptr) {
        vector->sum_row(p, r, out, freqs.data(), acc.data(), stream);
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
        // The sines and cosines first (a loop that vectorizes), then added in the row's order.
        const std::int64_t half = dim / 2;
        float* sin_v = a + dim;
        float* cos_v = a + dim + half;
#pragma omp simd
        for (std::int64_t i = 0; i < half; ++i) {
          detail::sinusoid_sin_cos(r.position, freqs[i], &sin_v[i], &cos_v[i]);
        }
        const bool split = p.sinusoid_layout == SinusoidLayout::split;
#pragma omp simd
        for (std::int64_t i = 0; i < half; ++i) {
          a[split ? i : 2 * i] += sin_v[i];
          a[split ? half + i : 2 * i + 1] += cos_v[i];
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
#if EMBROPE_CPU_X86
    // Streaming stores are weakly ordered: fence them before the team joins and the caller
    // reads the output.
    if (stream && vector != nullptr) _mm_sfence();
#endif
  }

  detail::lower_bad_index(p.bad, first_bad, detail::BadIndexOp::embed, [&](std::int64_t key) {
    return detail::resolve_embed_row(p, detail::bad_index_row(key)).bad;
  });
}

}  // namespace

void embed(const detail::EmbedParams& p) {
  const Isa isa = active_isa();
  detail::dispatch_value_dtype(p.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const VectorBody<T>* vector = nullptr;
#if EMBROPE_CPU_X86
    static const VectorBody<T> avx512_body{avx512::sum_row<T>, avx512::copy_row<T>};
    static const VectorBody<T> avx2_body{avx2::sum_row<T>, avx2::copy_row<T>};
    if (isa == Isa::avx512) vector = &avx512_body;
    if (isa == Isa::avx2) vector = &avx2_body;
#endif
    (void)isa;
    embed_kernel<T>(p, vector);
  });
}

}  // namespace embrope::cpu
