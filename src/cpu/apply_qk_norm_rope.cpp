// qk-norm + RoPE on the CPU: RMSNorm of each (token, head) row (Zhang & Sennrich 2019,
// arXiv:1910.07467; per head as in Qwen3 and Gemma 3) followed by the RoFormer rotation (Su et
// al. 2021), and the gradient of the pair. The arithmetic is detail/norm_math.hpp's and
// detail/rope_math.hpp's, the order of every sum the one the CUDA kernels take, so that both
// backends give the same bits (docs/numerics.md). Threaded with OpenMP: rows (forward), chunks
// of kWeightGradRows rows (backward, whose weight gradient sums the chunks in order).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "isa.hpp"
#include "per_thread.hpp"
#include "token_schedule.hpp"

namespace embrope::cpu {

using detail::from_float;
using detail::to_float;

// Head rows handed to a vector body's qk_norm_rope_rows at once: a token's rows in groups of
// this many (Qwen3's 32 + 8 heads: three groups).
constexpr int kQkRowGroup = 16;

// The rotation of apply_rope's vector body, then the norm's.
#define EMBROPE_VECTOR_BODY "float8.inc"
#include "vector_bodies.hpp"
#define EMBROPE_VECTOR_BODY "store_vectors.inc"
#include "vector_bodies.hpp"
#define EMBROPE_VECTOR_BODY "apply_rope.inc"
#include "vector_bodies.hpp"
#define EMBROPE_VECTOR_BODY "apply_qk_norm_rope.inc"
#include "vector_bodies.hpp"
#include "float8.hpp"

namespace {

using internal::QkNormRopeParams;

// rstd of a row of D values, its sum of squares in the canonical order.
template <typename T>
float row_rstd(const T* x, std::int64_t dim, float eps) {
  const float sum = detail::canonical_row_sum(
      dim, [x](std::int64_t j) { return detail::norm_square_term(to_float(x[j]), 0.0f); });
  return detail::norm_rstd(sum, dim, eps);
}

// The portable path. Normalises and rotates one head row into O (T, or float32 for a float8
// output); `in` and `out` may be the same row (each pair is read before it is written).
template <typename T, typename C, typename O = T>
void forward_row(const QkNormRopeParams& p, bool is_q, const T* in, O* out,
                 internal::TokenPositions pos, float sin_sign) {
  const internal::RopeParams& r = p.rope;
  const float rstd = row_rstd(in, r.head_dim, p.norm.eps);
  const auto normalized = [&](std::int64_t j) {
    return detail::norm_product(detail::rms_normalized(to_float(in[j]), rstd),
                                internal::qk_norm_weight(p.norm, is_q, j));
  };
  for (std::int64_t i = 0; i < r.rotary_dim / 2; ++i) {
    const std::int64_t ia = internal::rope_pair_first(r, i), ib = internal::rope_pair_second(r, i);
    float c, s;
    internal::rope_pair_cos_sin<C>(r, pos, i, sin_sign, c, s);
    float a = normalized(ia), b = normalized(ib);
    detail::rotate_pair(a, b, c, s);
    out[ia] = from_float<O>(a);
    out[ib] = from_float<O>(b);
  }
  for (std::int64_t j = r.rotary_dim; j < r.head_dim; ++j) out[j] = from_float<O>(normalized(j));
}

template <typename T, typename C>
void forward(const QkNormRopeParams& p) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t heads = r.q.heads + (r.has_k ? r.k.heads : 0);
  const std::int64_t rows = r.batch * r.seq * heads;
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
  std::int64_t first_bad = internal::kNoBadIndex;
  const bool threaded = rows * r.head_dim >= (1 << 15);
#pragma omp parallel for if (threaded) schedule(static) reduction(min : first_bad)
  for (std::int64_t n = 0; n < rows; ++n) {
    const std::int64_t t = n / heads, h = n % heads;
    const std::int64_t b = t / r.seq, s = t % r.seq;
    const internal::RopeRow<T> row = internal::rope_row<T>(r, b, s, h);
    if (internal::rope_bad_stream(r, b, s) >= 0) {
      std::fill(row.out, row.out + r.head_dim, from_float<T>(0.0f));
      first_bad = std::min(first_bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
      continue;
    }
    forward_row<T, C>(p, h < r.q.heads, row.in, row.out, internal::token_positions(r, b, s),
                      sin_sign);
  }
  internal::lower_bad_index(r.bad, first_bad, r.bad_op, [&](std::int64_t key) {
    return internal::rope_bad_position(r, internal::bad_index_row(key));
  });
}

// The vector path (x86 with AVX2 or AVX-512): tokens in parallel; per token the cos/sin row
// widened once by apply_rope.inc's widen_token, per call the weight factors; the head rows, up
// to kQkRowGroup at once, by an instruction set's qk_norm_rope_rows.
template <typename T, typename O = T>
using QkRows = void (*)(const T* const*, O* const*, const float* const*, int, std::int64_t,
                        std::int64_t, RopeLayout, const float*, const float*, float, float*);
using WidenToken = void (*)(const internal::RopeParams&, std::int64_t, std::int64_t, float*,
                            float*);

// An instruction set's functions for the vector path, or null ones for the portable path.
template <typename T, typename O = T>
struct VectorBody {
  QkRows<T, O> rows = nullptr;
  WidenToken widen = nullptr;
  explicit operator bool() const { return rows != nullptr; }
};

// Floats of a token's scratch: cos, sin (rotary_dim each), then the row scratch (256 partials
// + head_dim).
std::int64_t token_floats(const internal::RopeParams& r) {
  return 2 * r.rotary_dim + detail::kNormPartials + r.head_dim;
}

// The weight factors of q's rows (head_dim floats), then of k's.
void weight_factors(const QkNormRopeParams& p, float* weights) {
  const std::int64_t dim = p.rope.head_dim;
  for (std::int64_t j = 0; j < dim; ++j) {
    weights[j] = internal::qk_norm_weight(p.norm, true, j);
    weights[dim + j] = p.rope.has_k ? internal::qk_norm_weight(p.norm, false, j) : 1.0f;
  }
}

// Token t (its position valid): the cos/sin row widened once by widen into buffer, then
// group(h0, n, cos_w, sin_w, scratch) for each group of n head rows from h0 (n at most
// kQkRowGroup).
template <typename Group>
void for_each_row_group(const QkNormRopeParams& p, std::int64_t t, WidenToken widen, float* buffer,
                        Group&& group) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t heads = r.q.heads + (r.has_k ? r.k.heads : 0);
  float* const cos_w = buffer;
  float* const sin_w = cos_w + r.rotary_dim;
  float* const scratch = sin_w + r.rotary_dim;
  widen(r, t / r.seq, t % r.seq, cos_w, sin_w);
  for (std::int64_t h0 = 0; h0 < heads; h0 += kQkRowGroup) {
    group(h0, static_cast<int>(std::min<std::int64_t>(kQkRowGroup, heads - h0)), cos_w, sin_w,
          scratch);
  }
}

// Head rows h0 .. h0 + n - 1 of token t: their inputs, outputs (the rows' own, or with row_f
// float32 rows there, one per row, which a float8 output then scales and rounds) and weight
// factors.
template <typename T, typename O = T>
struct RowGroup {
  const T* in[kQkRowGroup];
  O* out[kQkRowGroup];
  const float* weight[kQkRowGroup];

  RowGroup(const internal::RopeParams& r, std::int64_t t, std::int64_t h0, int n,
           const float* weights, O* row_f = nullptr) {
    const std::int64_t b = t / r.seq, s = t % r.seq;
    for (int q = 0; q < n; ++q) {
      const std::int64_t h = h0 + q;
      if (row_f != nullptr) {  // the row's own output is not of type O: not formed
        in[q] = internal::rope_row<T>(r, b, s, h).in;
        out[q] = row_f + q * r.head_dim;
      } else {
        const internal::RopeRow<T, O> row = internal::rope_row<T, O>(r, b, s, h);
        in[q] = row.in;
        out[q] = row.out;
      }
      weight[q] = weights + (h < r.q.heads ? 0 : r.head_dim);
    }
  }
};

// Token t's head rows by the instruction set's body.
template <typename T>
void forward_token(const QkNormRopeParams& p, std::int64_t t, const VectorBody<T>& body,
                   const float* weights, float* buffer) {
  const internal::RopeParams& r = p.rope;
  for_each_row_group(
      p, t, body.widen, buffer,
      [&](std::int64_t h0, int n, const float* cos_w, const float* sin_w, float* scratch) {
        const RowGroup<T> g(r, t, h0, n, weights);
        body.rows(g.in, g.out, g.weight, n, r.head_dim, r.rotary_dim, r.layout, cos_w, sin_w,
                  p.norm.eps, scratch);
      });
}

// stream: body.rows writes with streaming stores, fenced here.
template <typename T>
void forward_by_token(const QkNormRopeParams& p, const VectorBody<T>& body, bool stream) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t tokens = r.batch * r.seq;
  const std::int64_t heads = r.q.heads + (r.has_k ? r.k.heads : 0);
  const std::int64_t dim = r.head_dim;
  std::vector<float> weights(static_cast<std::size_t>(2 * dim));
  weight_factors(p, weights.data());
  std::int64_t first_bad = internal::kNoBadIndex;
  const bool threaded = tokens > 1 && tokens * heads * dim >= (1 << 15);
  PerThread<std::vector<float>> buffers(threaded, static_cast<std::size_t>(token_floats(r)));
#pragma omp parallel num_threads(buffers.threads()) if (threaded) reduction(min : first_bad)
  {
    std::vector<float>& buffer = buffers.mine();
#pragma omp for EMBROPE_TOKEN_SCHEDULE
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t b = t / r.seq, s = t % r.seq;
      if (internal::rope_bad_stream(r, b, s) >= 0) {
        for (std::int64_t h = 0; h < heads; ++h) {
          T* out = internal::rope_row<T>(r, b, s, h).out;
          std::fill(out, out + dim, from_float<T>(0.0f));
        }
        first_bad =
            std::min(first_bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
        continue;
      }
      forward_token<T>(p, t, body, weights.data(), buffer.data());
    }
    if (stream) fence_streaming_stores();
  }
  internal::lower_bad_index(r.bad, first_bad, r.bad_op, [&](std::int64_t key) {
    return internal::rope_bad_position(r, internal::bad_index_row(key));
  });
}

// The instruction set's body with rows into O (T, or float32) and tables of C, or a null one
// for the portable path. Stream: its rows written with streaming stores (qk_norm_rope_rows).
template <typename T, typename C, typename O = T, bool Stream = false>
VectorBody<T, O> vector_body(Isa isa) {
#if EMBROPE_CPU_X86
  if constexpr (std::is_same_v<T, detail::BFloat16>) {
    if (isa == Isa::avx512_bf16) {
      return {avx512_bf16::qk_norm_rope_rows<T, O, Stream>, avx512_bf16::widen_token<C>};
    }
  }
  if (isa >= Isa::avx512) return {avx512::qk_norm_rope_rows<T, O, Stream>, avx512::widen_token<C>};
  if (isa == Isa::avx2) return {avx2::qk_norm_rope_rows<T, O, Stream>, avx2::widen_token<C>};
#endif
  (void)isa;
  return {};
}

// The gradient of one head row: dy (the output's gradient) in, dx out (may be dy's row), x
// the forward's input. g and xhat: D floats of scratch. Adds g_j * xhat_j to partial[j] when
// partial is non-null.
template <typename T, typename C>
void backward_row(const QkNormRopeParams& p, bool is_q, const T* dy, T* dx, const T* x,
                  internal::TokenPositions pos, float sin_sign, float* g, float* xhat,
                  float* partial) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t dim = r.head_dim;
  const float rstd = row_rstd(x, dim, p.norm.eps);
  // g: the gradient of the normalised row, the output's gradient rotated back.
  for (std::int64_t i = 0; i < r.rotary_dim / 2; ++i) {
    const std::int64_t ia = internal::rope_pair_first(r, i), ib = internal::rope_pair_second(r, i);
    float c, s;
    internal::rope_pair_cos_sin<C>(r, pos, i, sin_sign, c, s);
    float a = to_float(dy[ia]), b = to_float(dy[ib]);
    detail::rotate_pair(a, b, c, s);
    g[ia] = a;
    g[ib] = b;
  }
  for (std::int64_t j = r.rotary_dim; j < dim; ++j) g[j] = to_float(dy[j]);
  for (std::int64_t j = 0; j < dim; ++j) {
    xhat[j] = detail::rms_normalized(to_float(x[j]), rstd);
    if (partial != nullptr) partial[j] += detail::norm_product(g[j], xhat[j]);
    g[j] = detail::norm_product(internal::qk_norm_weight(p.norm, is_q, j), g[j]);  // now u
  }
  const float sum = detail::canonical_row_sum(
      dim, [&](std::int64_t j) { return detail::norm_product(g[j], xhat[j]); });
  const float c = detail::rms_backward_factor(sum, dim, rstd);
  for (std::int64_t j = 0; j < dim; ++j) {
    dx[j] = from_float<T>(detail::rms_backward_value(g[j], xhat[j], rstd, c));
  }
}

// The rows of q (is_q) or k, chunk by chunk; the weight gradient (if requested) from the chunk
// partials summed in order.
template <typename T, typename C>
std::int64_t backward_side(const QkNormRopeParams& p, bool is_q) {
  const internal::RopeParams& r = p.rope;
  const std::int64_t side_heads = is_q ? r.q.heads : r.k.heads;
  const std::int64_t head_offset = is_q ? 0 : r.q.heads;
  const std::int64_t rows = r.batch * r.seq * side_heads;
  const std::int64_t dim = r.head_dim;
  float* const weight_grad = is_q ? p.q_weight_grad : p.k_weight_grad;
  const std::int64_t chunks = detail::weight_grad_chunks(rows);
  std::vector<float> partials(weight_grad != nullptr ? static_cast<std::size_t>(chunks * dim) : 0,
                              0.0f);
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
  std::int64_t first_bad = internal::kNoBadIndex;
  const bool threaded = rows * dim >= (1 << 15);
  // No rows, no scratch: a zero-size call may declare any head dim.
  PerThread<std::vector<float>> scratches(threaded,
                                          rows > 0 ? static_cast<std::size_t>(2 * dim) : 0);
#pragma omp parallel num_threads(scratches.threads()) if (threaded) reduction(min : first_bad)
  {
    std::vector<float>& scratch = scratches.mine();
#pragma omp for schedule(static)
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      float* partial = weight_grad != nullptr ? partials.data() + chunk * dim : nullptr;
      const std::int64_t end = std::min(rows, (chunk + 1) * detail::kWeightGradRows);
      for (std::int64_t n = chunk * detail::kWeightGradRows; n < end; ++n) {
        const std::int64_t t = n / side_heads, h = n % side_heads;
        const std::int64_t b = t / r.seq, s = t % r.seq;
        const internal::RopeRow<T> row = internal::rope_row<T>(r, b, s, head_offset + h);
        if (internal::rope_bad_stream(r, b, s) >= 0) {
          std::fill(row.out, row.out + dim, from_float<T>(0.0f));
          first_bad =
              std::min(first_bad, internal::bad_index_key(t, internal::BadIndexArg::positions));
          continue;
        }
        backward_row<T, C>(p, is_q, row.in, row.out, internal::qk_saved_row<T>(p, is_q, b, s, h),
                           internal::token_positions(r, b, s), sin_sign, scratch.data(),
                           scratch.data() + dim, partial);
      }
    }
  }
  if (weight_grad != nullptr) {
    for (std::int64_t j = 0; j < dim; ++j) {
      float sum = 0.0f;
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partials[chunk * dim + j];
      weight_grad[j] = sum;
    }
  }
  return first_bad;
}

template <typename T, typename C>
void backward(const QkNormRopeParams& p) {
  std::int64_t first_bad = backward_side<T, C>(p, true);
  if (p.rope.has_k) first_bad = std::min(first_bad, backward_side<T, C>(p, false));
  internal::lower_bad_index(p.rope.bad, first_bad, p.rope.bad_op, [&](std::int64_t key) {
    return internal::rope_bad_position(p.rope, internal::bad_index_row(key));
  });
}

template <typename Run>
void dispatch(const QkNormRopeParams& p, Run&& run) {
  internal::dispatch_value_dtype(p.rope.dtype, [&](auto t) {
    internal::dispatch_value_dtype(p.rope.table_dtype, [&](auto c) { run(t, c); });
  });
}

}  // namespace

void apply_qk_norm_rope(const QkNormRopeParams& p) {
  const Isa isa = active_isa();
  dispatch(p, [&](auto t, auto c) {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    // A large output apart from the input is written with streaming stores (simd.hpp's
    // kStreamingOutputBytes); in place, the rows' lines are read anyway.
    const internal::RopeParams& r = p.rope;
    const std::int64_t output_bytes = r.batch * r.seq * internal::rope_rotated_heads(r) *
                                      r.head_dim * static_cast<std::int64_t>(sizeof(T));
    const bool stream = r.q.out != r.q.in && output_bytes >= kStreamingOutputBytes;
    if (const VectorBody<T> body =
            stream ? vector_body<T, C, T, true>(isa) : vector_body<T, C>(isa)) {
      return forward_by_token<T>(p, body, stream);
    }
    forward<T, C>(p);
  });
}

void qk_norm_weight_factors(const internal::QkNormRopeParams& p, float* weights) {
  weight_factors(p, weights);
}

std::int64_t qk_norm_token_floats(const internal::QkNormRopeParams& p) {
  // The token's scratch, and a float8 output's float32 rows (a group of them).
  return token_floats(p.rope) + kQkRowGroup * p.rope.head_dim;
}

void qk_norm_rope_one_token(const internal::QkNormRopeParams& token, const float* weights,
                            float* scratch) {
  const Isa isa = active_isa();
  const internal::RopeParams& r = token.rope;
  float* const buffer = scratch;
  const float sin_sign = r.inverse ? -1.0f : 1.0f;
  dispatch(token, [&](auto t, auto c) {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    if (internal::rope_quantized(r)) {
      // Float8 outputs: each row normalised and rotated into float32, then stored as
      // O(value * scale), rounded once (apply_rope's float8 rule).
      float* const row_f = buffer + token_floats(r);
      return internal::dispatch_float8_dtype(r.out_dtype, [&](auto o) {
        using O = typename decltype(o)::type;
        const QuantizeValues<float, O> quantize_row = quantize_values_for<float, O>(isa);
        const auto quantize = [&](std::int64_t h, const float* row) {
          quantize_row(row, internal::rope_row<T, O>(r, 0, 0, h).out, r.head_dim,
                       internal::rope_out_scale(r, h));
        };
        if (const VectorBody<T, float> body = vector_body<T, C, float>(isa)) {
          return for_each_row_group(token, 0, body.widen, buffer,
                                    [&](std::int64_t h0, int n, const float* cos_w,
                                        const float* sin_w, float* row_scratch) {
                                      const RowGroup<T, float> g(r, 0, h0, n, weights, row_f);
                                      body.rows(g.in, g.out, g.weight, n, r.head_dim, r.rotary_dim,
                                                r.layout, cos_w, sin_w, token.norm.eps,
                                                row_scratch);
                                      for (int q = 0; q < n; ++q)
                                        quantize(h0 + q, row_f + q * r.head_dim);
                                    });
        }
        const internal::TokenPositions pos = internal::token_positions(r, 0, 0);
        for (std::int64_t h = 0; h < internal::rope_rotated_heads(r); ++h) {
          forward_row<T, C, float>(token, h < r.q.heads, internal::rope_row<T>(r, 0, 0, h).in,
                                   row_f, pos, sin_sign);
          quantize(h, row_f);
        }
      });
    }
    if (const VectorBody<T> body = vector_body<T, C>(isa)) {
      return forward_token<T>(token, 0, body, weights, buffer);
    }
    const internal::TokenPositions pos = internal::token_positions(r, 0, 0);
    for (std::int64_t h = 0; h < internal::rope_rotated_heads(r); ++h) {
      const internal::RopeRow<T> row = internal::rope_row<T>(r, 0, 0, h);
      forward_row<T, C>(token, h < r.q.heads, row.in, row.out, pos, sin_sign);
    }
  });
}

void apply_qk_norm_rope_backward(const QkNormRopeParams& p) {
  dispatch(p, [&](auto t, auto c) {
    backward<typename decltype(t)::type, typename decltype(c)::type>(p);
  });
}

}  // namespace embrope::cpu
