// RoPE on the CPU: Su et al. 2021 (RoFormer), pairs as in GPT-NeoX (rotate_half) or GPT-J
// (interleaved). One (token, head) row per iteration, threaded with OpenMP; the inner loops
// touch only the row and the token's cos/sin row and are vectorized (omp simd).
#include <algorithm>
#include <cstring>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"

namespace embrope::cpu {
namespace {

using detail::from_float;
using detail::to_float;

// Rotates one head row. `in` and `out` may be the same row (each iteration reads and writes
// only its own pair, so in place is safe under simd).
template <typename T, typename C>
void rotate_row(const T* in, T* out, const C* cos_row, const C* sin_row, std::int64_t rotary_dim,
                std::int64_t head_dim, RopeLayout layout, float sin_sign) {
  const std::int64_t half = rotary_dim / 2;
  if (layout == RopeLayout::neox) {
#pragma omp simd
    for (std::int64_t i = 0; i < half; ++i) {
      float a = to_float(in[i]);
      float b = to_float(in[i + half]);
      detail::rotate_pair(a, b, to_float(cos_row[i]), sin_sign * to_float(sin_row[i]));
      out[i] = from_float<T>(a);
      out[i + half] = from_float<T>(b);
    }
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < half; ++i) {
      float a = to_float(in[2 * i]);
      float b = to_float(in[2 * i + 1]);
      detail::rotate_pair(a, b, to_float(cos_row[i]), sin_sign * to_float(sin_row[i]));
      out[2 * i] = from_float<T>(a);
      out[2 * i + 1] = from_float<T>(b);
    }
  }
  if (out != in && head_dim > rotary_dim) {
    std::memcpy(out + rotary_dim, in + rotary_dim,
                static_cast<std::size_t>(head_dim - rotary_dim) * sizeof(T));
  }
}

template <typename T, typename C>
void rope_kernel(const detail::RopeParams& p) {
  const std::int64_t tokens = p.batch * p.seq;
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const std::int64_t rows = tokens * heads;
  const std::int64_t half = p.rotary_dim / 2;
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const auto* cos_base = static_cast<const C*>(p.cos);
  const auto* sin_base = static_cast<const C*>(p.sin);
  std::int64_t first_bad = detail::kNoBadIndex;
  // Threads pay off only past a few thousand elements (decode-sized calls stay serial).
  const bool threaded = rows * p.head_dim >= (1 << 15);

#pragma omp parallel if (threaded)
  {
    // mrope: the token's cos/sin row gathered from its three streams' table rows.
    std::vector<C> gathered(p.mrope ? static_cast<std::size_t>(p.rotary_dim) : 0);
    std::int64_t gathered_token = -1;
#pragma omp for schedule(static) reduction(min : first_bad)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t t = r / heads;
      const std::int64_t h = r % heads;
      const std::int64_t b = t / p.seq;
      const std::int64_t s = t % p.seq;
      const detail::RopeRow<T> row = detail::rope_row<T>(p, b, s, h);
      const T* in = row.in;
      T* out = row.out;
      if (detail::rope_bad_stream(p, b, s) >= 0) {
        std::fill(out, out + p.head_dim, from_float<T>(0.0f));
        first_bad = std::min(first_bad, detail::bad_index_key(t, detail::BadIndexArg::positions));
        continue;
      }
      const C* cos_row;
      const C* sin_row;
      if (p.mrope) {
        if (gathered_token != t) {
          std::int64_t stream_position[3];
          for (int j = 0; j < 3; ++j) stream_position[j] = detail::rope_position(p, b, s, j);
          for (std::int64_t i = 0; i < half; ++i) {
            const std::int64_t position = stream_position[detail::mrope_stream(i, p.mrope_end)];
            gathered[i] = cos_base[position * p.cos_stride + i];
            gathered[half + i] = sin_base[position * p.sin_stride + i];
          }
          gathered_token = t;
        }
        cos_row = gathered.data();
        sin_row = gathered.data() + half;
      } else {
        const std::int64_t position = detail::rope_position(p, b, s, 0);
        cos_row = cos_base + position * p.cos_stride;
        sin_row = sin_base + position * p.sin_stride;
      }
      rotate_row(in, out, cos_row, sin_row, p.rotary_dim, p.head_dim, p.layout, sin_sign);
    }
  }

  detail::lower_bad_index(p.bad, first_bad, p.bad_op, [&](std::int64_t key) {
    return detail::rope_bad_position(p, detail::bad_index_row(key));
  });
}

}  // namespace

void apply_rope(const detail::RopeParams& p) {
  detail::dispatch_value_dtype(p.dtype, [&](auto t) {
    detail::dispatch_value_dtype(p.table_dtype, [&](auto c) {
      rope_kernel<typename decltype(t)::type, typename decltype(c)::type>(p);
    });
  });
}

}  // namespace embrope::cpu
