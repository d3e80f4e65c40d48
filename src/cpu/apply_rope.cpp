// RoPE on the CPU: Su et al. 2021 (RoFormer), pairs as in GPT-NeoX (rotate_half) or GPT-J
// (interleaved), threaded with OpenMP. Two paths with the same bits: the portable one, one
// (token, head) row per iteration with omp simd loops; and on x86 the vector one
// (apply_rope.inc, for AVX2 + F16C or AVX-512, chosen at run time by isa.hpp), one token per
// iteration with its cos/sin row widened once.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "isa.hpp"
#include "per_thread.hpp"
#include "token_schedule.hpp"

namespace embrope::cpu {

using detail::from_float;
using detail::to_float;

#define EMBROPE_VECTOR_BODY "float8.inc"
#include "vector_bodies.hpp"
#define EMBROPE_VECTOR_BODY "store_vectors.inc"
#include "vector_bodies.hpp"
#define EMBROPE_VECTOR_BODY "apply_rope.inc"
#include "vector_bodies.hpp"
#include "float8.hpp"

namespace {

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

// A token's cos/sin row widened to float32 (exact), cos then sin, rotary_dim floats: each
// frequency's entry from its stream's table row.
template <typename C>
void widen_cos_sin(const internal::RopeParams& p, const internal::TokenPositions& pos,
                   float* widened) {
  const std::int64_t half = p.rotary_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    internal::rope_pair_cos_sin<C>(p, pos, i, 1.0f, widened[i], widened[half + i]);
  }
}

template <typename T, typename C>
void rope_kernel(const internal::RopeParams& p) {
  const std::int64_t tokens = p.batch * p.seq;
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const std::int64_t rows = tokens * heads;
  const std::int64_t half = p.rotary_dim / 2;
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const auto* cos_base = static_cast<const C*>(p.cos);
  const auto* sin_base = static_cast<const C*>(p.sin);
  std::int64_t first_bad = internal::kNoBadIndex;
  // Threads pay off only past a few thousand elements (decode-sized calls stay serial).
  const bool threaded = rows * p.head_dim >= (1 << 15);

  // mrope: the token's cos/sin row gathered from its three streams' table rows, widened to
  // float32 (exact).
  PerThread<std::vector<float>> gathered_rows(threaded,
                                              p.mrope ? static_cast<std::size_t>(p.rotary_dim) : 0);
#pragma omp parallel num_threads(gathered_rows.threads()) if (threaded)
  {
    std::vector<float>& gathered = gathered_rows.mine();
    std::int64_t gathered_token = -1;
#pragma omp for schedule(static) reduction(min : first_bad)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t t = r / heads;
      const std::int64_t h = r % heads;
      const std::int64_t b = t / p.seq;
      const std::int64_t s = t % p.seq;
      const internal::RopeRow<T> row = internal::rope_row<T>(p, b, s, h);
      const T* in = row.in;
      T* out = row.out;
      if (internal::rope_bad_stream(p, b, s) >= 0) {
        std::fill(out, out + p.head_dim, from_float<T>(0.0f));
        first_bad =
            std::min(first_bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
        continue;
      }
      if (p.mrope) {
        if (gathered_token != t) {
          widen_cos_sin<C>(p, internal::token_positions(p, b, s), gathered.data());
          gathered_token = t;
        }
        rotate_row(in, out, gathered.data(), gathered.data() + half, p.rotary_dim, p.head_dim,
                   p.layout, sin_sign);
      } else {
        const std::int64_t position = internal::rope_position(p, b, s, 0);
        rotate_row(in, out, cos_base + position * p.cos_stride, sin_base + position * p.sin_stride,
                   p.rotary_dim, p.head_dim, p.layout, sin_sign);
      }
    }
  }

  internal::lower_bad_index(p.bad, first_bad, p.bad_op, [&](std::int64_t key) {
    return internal::rope_bad_position(p, internal::bad_index_row(key));
  });
}

// Floats per rotary dim of a token's scratch: its cos and sin rows widened, and a float8
// output's rotated row (rotate_token_quantized).
constexpr std::int64_t kWidenedFloats = 3;

// The vector path: tokens in parallel, each rotated by an instruction set's rotate_token.
template <typename T>
using RotateToken = void (*)(const internal::RopeParams&, std::int64_t, float*, float*);

// Float8 outputs: token (b, s)'s non-rotary rows (q_nope's, then k_nope's) stored as
// O(value * scale) with their head's scale, rounded once; zero codes for a bad token.
template <typename T, typename O>
void quantize_nope_rows(const internal::RopeParams& p, std::int64_t b, std::int64_t s, bool bad) {
  const QuantizeValues<T, O> quantize = quantize_values_for<T, O>(active_isa());
  for (std::int64_t n = 0; n < internal::rope_nope_heads(p); ++n) {
    const internal::RopeNopeRow<T, O> row = internal::rope_nope_row<T, O>(p, b, s, n);
    if (bad) {
      std::fill(row.out, row.out + row.dim, from_float<O>(0.0f));
      continue;
    }
    quantize(row.in, row.out, row.dim, internal::rope_out_scale(p, row.head));
  }
}

// O: the outputs' element type (T, or a float8 type, whose calls may carry non-rotary rows).
template <typename T, typename O = T>
void rope_by_token(const internal::RopeParams& p, RotateToken<T> rotate_token) {
  const std::int64_t tokens = p.batch * p.seq;
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  const bool nope = !std::is_same_v<O, T> && internal::rope_nope_heads(p) > 0;
  // Rotates token t (or zero-fills it and returns its bad-index key).
  const auto token = [&](std::int64_t t, float* widened) -> std::int64_t {
    const std::int64_t b = t / p.seq, s = t % p.seq;
    const bool bad = internal::rope_bad_stream(p, b, s) >= 0;
    if constexpr (!std::is_same_v<O, T>) {
      if (nope) quantize_nope_rows<T, O>(p, b, s, bad);
    }
    if (bad) {
      // Zero is all zero bits in every output dtype; a float8 row is head_dim bytes.
      for (std::int64_t h = 0; h < heads; ++h) {
        if (internal::rope_quantized(p)) {
          std::uint8_t* out = internal::rope_row<T, std::uint8_t>(p, b, s, h).out;
          std::fill(out, out + p.head_dim, std::uint8_t{0});
        } else {
          T* out = internal::rope_row<T>(p, b, s, h).out;
          std::fill(out, out + p.head_dim, from_float<T>(0.0f));
        }
      }
      return internal::bad_index_key(t, internal::BadIndexArg::positions);
    }
    rotate_token(p, t, widened, widened + p.rotary_dim);
    return internal::kNoBadIndex;
  };
  std::int64_t first_bad = internal::kNoBadIndex;
  if (tokens <= 1 || tokens * heads * p.head_dim < (1 << 15)) {
    // Decode-sized calls: no thread team, and the widened row on the stack when it fits.
    constexpr std::int64_t kStackFloats = 1024;
    float stack[kStackFloats];
    std::vector<float> heap(
        kWidenedFloats * p.rotary_dim > kStackFloats ? kWidenedFloats * p.rotary_dim : 0);
    float* widened = heap.empty() ? stack : heap.data();
    for (std::int64_t t = 0; t < tokens; ++t) first_bad = std::min(first_bad, token(t, widened));
  } else {
    PerThread<std::vector<float>> widened_rows(
        true, static_cast<std::size_t>(kWidenedFloats * p.rotary_dim));
#pragma omp parallel num_threads(widened_rows.threads()) reduction(min : first_bad)
    {
      std::vector<float>& widened = widened_rows.mine();
#pragma omp for EMBROPE_TOKEN_SCHEDULE
      for (std::int64_t t = 0; t < tokens; ++t) {
        first_bad = std::min(first_bad, token(t, widened.data()));
      }
    }
  }
  internal::lower_bad_index(p.bad, first_bad, p.bad_op, [&](std::int64_t key) {
    return internal::rope_bad_position(p, internal::bad_index_row(key));
  });
}

// The portable path's rotation of one token (batch = seq = 1): the token's cos/sin row
// widened to float32 once (exact, so the same bits as rope_kernel's rows), then each head.
template <typename T, typename C>
void rotate_token_portable(const internal::RopeParams& p, float* widened) {
  const std::int64_t half = p.rotary_dim / 2;
  widen_cos_sin<C>(p, internal::token_positions(p, 0, 0), widened);
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  for (std::int64_t h = 0; h < heads; ++h) {
    const internal::RopeRow<T> row = internal::rope_row<T>(p, 0, 0, h);
    rotate_row(row.in, row.out, widened, widened + half, p.rotary_dim, p.head_dim, p.layout,
               p.inverse ? -1.0f : 1.0f);
  }
}

// Float8 outputs (RoPE + quantization, FlashInfer's rope_quantize_fp8), the portable path:
// token t's rows rotated in float32 and stored as O(value * scale) with one rounding, the
// pass-through elements scaled and rounded alike (the x86 paths: apply_rope.inc). cos_w and
// sin_w: rotary_dim / 2 floats each.
template <typename T, typename C, typename O>
void rotate_token_quantized(const internal::RopeParams& p, std::int64_t t, float* cos_w,
                            float* sin_w) {
  const std::int64_t b = t / p.seq, s = t % p.seq;
  const std::int64_t half = p.rotary_dim / 2;
  const float sin_sign = p.inverse ? -1.0f : 1.0f;
  const internal::TokenPositions pos = internal::token_positions(p, b, s);
  for (std::int64_t i = 0; i < half; ++i) {
    internal::rope_pair_cos_sin<C>(p, pos, i, sin_sign, cos_w[i], sin_w[i]);
  }
  const std::int64_t heads = p.q.heads + (p.has_k ? p.k.heads : 0);
  // One loop per layout (no per-element layout test), so that the loops vectorize: the
  // float8 conversion is branch-free (detail::float_to_float8).
  const bool neox = p.layout == RopeLayout::neox;
  for (std::int64_t h = 0; h < heads; ++h) {
    const internal::RopeRow<T, O> row = internal::rope_row<T, O>(p, b, s, h);
    const T* in = row.in;
    O* out = row.out;
    const float scale = internal::rope_out_scale(p, h);
    if (neox) {
#pragma omp simd
      for (std::int64_t i = 0; i < half; ++i) {
        float a = to_float(in[i]), v = to_float(in[i + half]);
        detail::rotate_pair(a, v, cos_w[i], sin_w[i]);
        out[i] = internal::rope_output_value<T, O>(a, scale);
        out[i + half] = internal::rope_output_value<T, O>(v, scale);
      }
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < half; ++i) {
        float a = to_float(in[2 * i]), v = to_float(in[2 * i + 1]);
        detail::rotate_pair(a, v, cos_w[i], sin_w[i]);
        out[2 * i] = internal::rope_output_value<T, O>(a, scale);
        out[2 * i + 1] = internal::rope_output_value<T, O>(v, scale);
      }
    }
#pragma omp simd
    for (std::int64_t j = p.rotary_dim; j < p.head_dim; ++j) {
      out[j] = internal::rope_output_value<T, O>(to_float(in[j]), scale);
    }
  }
}

// One home for the choice of rotation: on_vector(t, rotate_token) with the active
// instruction set's token rotation, or on_portable(t, c) on the portable path; t and c are
// the value and table dtype tags.
template <typename OnVector, typename OnPortable>
void dispatch_rotation(const internal::RopeParams& p, OnVector&& on_vector,
                       OnPortable&& on_portable) {
  const Isa isa = active_isa();
  internal::dispatch_value_dtype(p.dtype, [&](auto t) {
    internal::dispatch_value_dtype(p.table_dtype, [&](auto c) {
      using T = typename decltype(t)::type;
      using C = typename decltype(c)::type;
#if EMBROPE_CPU_X86
      if constexpr (std::is_same_v<T, detail::BFloat16>) {
        if (isa == Isa::avx512_bf16) return on_vector(t, avx512_bf16::rotate_token<T, C>);
      }
      if (isa >= Isa::avx512) return on_vector(t, avx512::rotate_token<T, C>);
      if (isa == Isa::avx2) return on_vector(t, avx2::rotate_token<T, C>);
#endif
      (void)isa;
      on_portable(t, c);
    });
  });
}

// The float8 outputs' choice: on_rotation(t, o, rotate_token) with the active instruction set's
// quantized token rotation (t, o: the value and float8 dtype tags).
template <typename OnRotation>
void dispatch_quantized_rotation(const internal::RopeParams& p, OnRotation&& on_rotation) {
  const Isa isa = active_isa();
  internal::dispatch_value_dtype(p.dtype, [&](auto t) {
    internal::dispatch_value_dtype(p.table_dtype, [&](auto c) {
      internal::dispatch_float8_dtype(p.out_dtype, [&](auto o) {
        using T = typename decltype(t)::type;
        using C = typename decltype(c)::type;
        using O = typename decltype(o)::type;
#if EMBROPE_CPU_X86
        if (isa >= Isa::avx512) return on_rotation(t, o, avx512::rotate_token_quantized<T, C, O>);
        if (isa == Isa::avx2) return on_rotation(t, o, avx2::rotate_token_quantized<T, C, O>);
#endif
        (void)isa;
        on_rotation(t, o, rotate_token_quantized<T, C, O>);
      });
    });
  });
}

}  // namespace

void rotate_one_token(const internal::RopeParams& p, float* widened) {
  if (internal::rope_quantized(p)) {
    return dispatch_quantized_rotation(p, [&](auto t, auto o, auto rotate) {
      using T = typename decltype(t)::type;
      using O = typename decltype(o)::type;
      if (internal::rope_nope_heads(p) > 0) quantize_nope_rows<T, O>(p, 0, 0, false);
      rotate(p, 0, widened, widened + p.rotary_dim);
    });
  }
  dispatch_rotation(
      p, [&](auto, auto rotate) { rotate(p, 0, widened, widened + p.rotary_dim); },
      [&](auto t, auto c) {
        rotate_token_portable<typename decltype(t)::type, typename decltype(c)::type>(p, widened);
      });
}

void zero_one_token(const internal::RopeParams& p) {
  // Zero is all zero bits in every output dtype. Strides count the output's elements.
  const std::int64_t size = dtype_size(p.out_dtype);
  const auto zero_rows = [&](const internal::RopeHeads& x, std::int64_t dim) {
    for (std::int64_t h = 0; h < x.heads; ++h) {
      std::uint8_t* out = static_cast<std::uint8_t*>(x.out) + h * x.out_stride_h * size;
      std::fill(out, out + dim * size, std::uint8_t{0});
    }
  };
  zero_rows(p.q, p.head_dim);
  if (p.has_k) zero_rows(p.k, p.head_dim);
  zero_rows(p.q_nope, p.q_nope_dim);
  zero_rows(p.k_nope, p.k_nope_dim);
}

void apply_rope(const internal::RopeParams& p) {
  if (internal::rope_quantized(p)) {
    return dispatch_quantized_rotation(p, [&](auto t, auto o, auto rotate) {
      rope_by_token<typename decltype(t)::type, typename decltype(o)::type>(p, rotate);
    });
  }
  dispatch_rotation(
      p, [&](auto t, auto rotate) { rope_by_token<typename decltype(t)::type>(p, rotate); },
      [&](auto t, auto c) {
        rope_kernel<typename decltype(t)::type, typename decltype(c)::type>(p);
      });
}

}  // namespace embrope::cpu
