// embed on the CPU: one output row per iteration, threaded with OpenMP. The token row is
// scaled, then the positional row (learned, or sinusoidal after Vaswani et al. 2017) and the
// type row are added in float32, in that order, and the sum is rounded once, or first
// normalised (LayerNorm, Ba et al. 2016; RMSNorm, Zhang & Sennrich 2019) in the order of
// detail/norm_math.hpp. On x86, rows with a learned position, a type, a scale or a norm run
// the vector body (embed.inc, for AVX2 + F16C or AVX-512, chosen at run time by isa.hpp),
// with the portable path's bits.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "../backend.hpp"
#include "../dispatch.hpp"
#include "../embed_row.hpp"
#include "../quant_row.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/sinusoid.hpp"
#include "isa.hpp"
#include "per_thread.hpp"
#include "sinusoid_rows.hpp"

namespace embrope::cpu {

using detail::from_float;
using detail::to_float;

// The table rows that an output row reads (null: none): the token row (none for a shard miss),
// the learned position row and the type row.
template <typename T>
struct EmbedSources {
  const T* token = nullptr;
  const T* position = nullptr;
  const T* type = nullptr;
};

template <typename T>
EmbedSources<T> embed_sources(const internal::EmbedParams& p, const internal::EmbedRow& r) {
  EmbedSources<T> s;
  if (r.token_hit && !p.quantized) {
    s.token = static_cast<const T*>(p.table) + r.token * p.table_stride;
  }
  if (p.position_table != nullptr) {
    s.position = static_cast<const T*>(p.position_table) + r.position * p.position_table_stride;
  }
  if (p.type_table != nullptr) {
    s.type = static_cast<const T*>(p.type_table) + r.type * p.type_table_stride;
  }
  return s;
}

// dequantize_row, portable: the element loops alone (the vector bodies compile it again for
// their instruction sets, with their lanes).
struct ScalarLanes {
  static constexpr int width = 1;
};
#include "dequantize_row.inc"
void dequantize_row(const internal::QuantTable& q, std::int64_t row, std::int64_t begin,
                    std::int64_t end, float scale, float* a) {
  dequantize_row_lanes<ScalarLanes>(q, row, begin, end, scale, a, false);
}

namespace {

template <typename T>
struct VectorBody {  // embed.inc of one instruction set (its vector_body<T>())
  void (*sum_row)(const internal::EmbedParams&, const EmbedSources<T>&, T*, const SinusoidRow*,
                  const EmbedSources<T>&, bool);
  void (*sum_row_f32)(const internal::EmbedParams&, const EmbedSources<T>&, float*,
                      const SinusoidRow*, const EmbedSources<T>&, bool);
  void (*copy_row)(T*, const T*, const T*, std::int64_t, bool);
  void (*round_row)(T*, const float*, std::int64_t, bool);
  detail::NormStats (*norm_stats)(const float*, std::int64_t, bool, float);
  void (*norm_row)(T*, const float*, std::int64_t, detail::NormStats, const float*, const float*,
                   bool);
  SinusoidSinCosRow sinusoid_sin_cos_row;
  // A quantized row into float32 (positions, types or a norm added to it), or rounded to T.
  void (*dequantize_row)(const internal::QuantTable&, std::int64_t, std::int64_t, std::int64_t,
                         float, float*, bool);
  void (*dequantize_row_rounded)(const internal::QuantTable&, std::int64_t, std::int64_t,
                                 std::int64_t, float, T*, bool);
  // Null where the instruction set has no table lookups (AVX2); false for a table it does not
  // take.
  bool (*quant_row_by_table)(const internal::QuantTable&, std::int64_t, std::int64_t, float, T*,
                             bool);
};

}  // namespace

#define EMBROPE_VECTOR_BODY "store_vectors.inc"
#include "vector_bodies.hpp"
#define EMBROPE_VECTOR_BODY "embed.inc"
#include "vector_bodies.hpp"

namespace {

// The float32 weight and bias factors of a normalised call (internal::norm_factor), converted
// once per call.
void norm_factors(const internal::EmbedParams& p, std::vector<float>& weight,
                  std::vector<float>& bias) {
  weight.resize(static_cast<std::size_t>(p.dim));
  bias.resize(static_cast<std::size_t>(p.dim));
  for (std::int64_t j = 0; j < p.dim; ++j) {
    const internal::NormFactor f = internal::norm_factor(p, j);
    weight[static_cast<std::size_t>(j)] = f.weight;
    bias[static_cast<std::size_t>(j)] = f.bias;
  }
}

// Writes the pre-norm row (when asked), then the normalised row of the float32 sum `a`
// (streaming stores when the call asks for them, on the vector paths).
template <typename T>
void normalize_row(const internal::EmbedParams& p, const internal::EmbedRow& r, const float* a,
                   T* out, const float* weight, const float* bias, const VectorBody<T>* vector,
                   bool stream) {
  const std::int64_t dim = p.dim;
  if (p.pre_norm_out != nullptr) {
    if (p.pre_norm_dtype == DType::float32) {
      std::memcpy(static_cast<float*>(p.pre_norm_out) + r.pre_norm_offset, a,
                  static_cast<std::size_t>(dim) * sizeof(float));
    } else if (vector != nullptr) {
      vector->round_row(static_cast<T*>(p.pre_norm_out) + r.pre_norm_offset, a, dim, false);
    } else {
      T* pre = static_cast<T*>(p.pre_norm_out) + r.pre_norm_offset;
#pragma omp simd
      for (std::int64_t j = 0; j < dim; ++j) pre[j] = from_float<T>(a[j]);
    }
  }
  const bool layer = p.norm == Normalization::layer_norm;
  const detail::NormStats s = vector != nullptr ? vector->norm_stats(a, dim, layer, p.norm_eps)
                                                : detail::row_norm_stats(a, dim, layer, p.norm_eps);
  if (vector != nullptr) {
    vector->norm_row(out, a, dim, s, weight, bias, stream);
    return;
  }
#pragma omp simd
  for (std::int64_t j = 0; j < dim; ++j) {
    out[j] = from_float<T>(detail::norm_apply(a[j], s, weight[j], bias[j]));
  }
}

// The values a part of a quantized row decodes at a time (a multiple of every GGUF block; 2 KiB
// of float32).
constexpr std::int64_t kQuantPart = 512;

// Asks for the bytes of values [begin, end) of quantized row `row` (and, with the first part,
// the row's scales and zero points) in L2: a gather's rows lie at random addresses, where
// the hardware prefetchers restart (prefetch_lines). Bytes per value are uniform in every
// format, so the part's bytes are its share of the row's.
EMBROPE_PREFETCH_ONLY void prefetch_quant_part(const internal::QuantTable& q, std::int64_t row,
                                               std::int64_t begin, std::int64_t end,
                                               std::int64_t dim) {
#if EMBROPE_CPU_X86
  if (end <= begin) return;
  prefetch_lines(q.data + row * q.row_stride, begin * q.row_bytes / dim, end * q.row_bytes / dim);
  if (begin == 0 && q.scales != nullptr) {
    const std::int64_t groups = dim / q.group_size;
    prefetch_lines(q.scales, row * q.scale_stride * dtype_size(q.scale_dtype),
                   (row * q.scale_stride + groups) * dtype_size(q.scale_dtype));
    if (q.zero_points != nullptr) {
      prefetch_lines(q.zero_points, row * q.zero_point_stride * dtype_size(q.zero_point_dtype),
                     (row * q.zero_point_stride + groups) * dtype_size(q.zero_point_dtype));
    }
  }
#else
  (void)q, (void)row, (void)begin, (void)end, (void)dim;
#endif
}

// vector: the vector body (embed.inc), or null (the portable loops). A quantized table's row
// with positions, types or a norm is dequantized into the float32 sum by dequantize_row, the
// positions and types added by the portable loops, and the row normalised or rounded by the
// vector body; with nothing else to add, the vector body decodes it straight to T.
template <typename T>
void embed_kernel(const internal::EmbedParams& p, const VectorBody<T>* vector) {
  // Rows per chunk of the thread team (a sinusoidal block: a chunk of consecutive positions
  // shares at most two anchors).
  constexpr std::int64_t kChunk = detail::kSinusoidBlock;
  const std::int64_t dim = p.dim;
  const bool sinusoidal = p.positions == PositionEncoding::sinusoidal;
  const bool norm = p.norm != Normalization::none;
  // A quantized token table: dequantized into the float32 sum, or alone straight to T.
  const bool quantized = p.quantized;
  const bool plain =
      p.positions == PositionEncoding::none && p.type_table == nullptr && !norm && !quantized;
  // A quantized token table and nothing else to add: its rows are decoded straight to out.
  const bool quantized_alone =
      p.positions == PositionEncoding::none && p.type_table == nullptr && !norm && quantized;
  // A quantized table alone whose runs of 32 values share their factors and have 16 codes
  // each (or float8 into 16-bit values, groups long enough to pay for a table of 128 entries
  // each): its rows by quant_row_by_table (embed.inc), a table lookup per run, where that
  // function takes the table (it says which). 16K random rows of D 4096 to bfloat16 from DRAM
  // (2 cores): int4 (groups of 32) 1.65x, Q4_K 2.0x, float8 e4m3 1.4-1.7x as fast as decoding
  // each value (benchmarks/results/cpu-2026-11-28-quantized-tables/).
  const bool may_take_table =
      quantized_alone && vector != nullptr && vector->quant_row_by_table != nullptr;
  std::vector<float> norm_weight, norm_bias;
  if (norm) norm_factors(p, norm_weight, norm_bias);
  std::optional<SinusoidCall> sinusoids;
  if (sinusoidal) {
    sinusoids.emplace(
        dim, p.sinusoid_base, p.sinusoid_layout,
        vector != nullptr ? vector->sinusoid_sin_cos_row : portable_sinusoid_sin_cos_row);
  }
  std::int64_t first_bad = internal::kNoBadIndex;
  const bool threaded = p.rows * dim >= (1 << 15);
  // A large output is written with streaming stores (the vector bodies; simd.hpp).
  const bool stream = p.rows * dim * static_cast<std::int64_t>(sizeof(T)) >= kStreamingOutputBytes;

  struct Scratch {
    // The row's float32 sum (the portable path's, or the vector bodies' before a norm).
    std::vector<float> acc;
    std::optional<SinusoidCall::Rows> sinusoid_rows;
    Scratch(std::size_t acc_floats, const std::optional<SinusoidCall>& sinusoids)
        : acc(acc_floats) {
      if (sinusoids) sinusoid_rows.emplace(*sinusoids);
    }
  };
  PerThread<Scratch> scratches(threaded, static_cast<std::size_t>(plain ? 0 : dim), sinusoids);
#pragma omp parallel num_threads(scratches.threads()) reduction(min : first_bad) if (threaded)
  {
    std::vector<float>& acc = scratches.mine().acc;
    std::optional<SinusoidCall::Rows>& sinusoid_rows = scratches.mine().sinusoid_rows;
    // The thread's next row, resolved a row ahead (vector bodies only) so that its table rows
    // can be asked for while the current one is written.
    std::int64_t ahead_n = -1;
    internal::EmbedRow ahead;
    // Until quant_row_by_table declines a row (every row of a call has the same format).
    bool by_table = may_take_table;
    // Dynamic chunks: a thread that shares its core with other work takes fewer rows.
#pragma omp for schedule(dynamic, kChunk)
    for (std::int64_t n = 0; n < p.rows; ++n) {
      const internal::EmbedRow r = n == ahead_n ? ahead : internal::resolve_embed_row(p, n);
      EmbedSources<T> next;
      if (vector != nullptr && n + 1 < p.rows && (n + 1) % kChunk != 0) {
        ahead_n = n + 1;
        ahead = internal::resolve_embed_row(p, ahead_n);
        if (ahead.bad_key == internal::kNoBadIndex) next = embed_sources<T>(p, ahead);
      }
      T* out = static_cast<T*>(p.out) + r.out_offset;
      if (r.bad_key != internal::kNoBadIndex) {
        std::fill(out, out + dim, from_float<T>(0.0f));
        if (p.pre_norm_out != nullptr) {  // +0 is all-zero bits in every value dtype
          std::memset(
              static_cast<char*>(p.pre_norm_out) + r.pre_norm_offset * dtype_size(p.pre_norm_dtype),
              0, static_cast<std::size_t>(dim * dtype_size(p.pre_norm_dtype)));
        }
        first_bad = std::min(first_bad, r.bad_key);
        continue;
      }
      const EmbedSources<T> src = embed_sources<T>(p, r);
      const T* token = src.token;
      if (plain) {
        if (token == nullptr) {
          std::fill(out, out + dim, from_float<T>(0.0f));
        } else if (p.scale == 1.0f) {
          if (vector != nullptr) {
            vector->copy_row(out, token, next.token, dim, stream);
          } else {
            std::memcpy(out, token, static_cast<std::size_t>(dim) * sizeof(T));
          }
        } else if (vector != nullptr) {
          vector->sum_row(p, src, out, nullptr, next, stream);
        } else {
#pragma omp simd
          for (std::int64_t j = 0; j < dim; ++j)
            out[j] = from_float<T>(p.scale * to_float(token[j]));
        }
        continue;
      }
      SinusoidRow sinusoid_row{};
      const SinusoidRow* sinusoid = nullptr;
      if (sinusoidal) {
        sinusoid_row = sinusoid_rows->row(r.position);
        sinusoid = &sinusoid_row;
      }
      if (vector != nullptr && !quantized) {
        if (norm) {
          float* row = acc.data();
          vector->sum_row_f32(p, src, row, sinusoid, next, false);
          normalize_row(p, r, row, out, norm_weight.data(), norm_bias.data(), vector, stream);
        } else {
          vector->sum_row(p, src, out, sinusoid, next, stream);
        }
        continue;
      }
      float* a = acc.data();
      if (quantized && r.token_hit) {
        // The thread's next row (resolved by the vector bodies), asked for as this one is
        // decoded.
        const bool next_row =
            ahead_n == n + 1 && ahead.bad_key == internal::kNoBadIndex && ahead.token_hit;
        if (by_table) {
          if (next_row) prefetch_quant_part(p.quant, ahead.token, 0, dim, dim);
          if (vector->quant_row_by_table(p.quant, r.token, dim, p.scale, out, stream)) continue;
          by_table = false;
        }
        if (quantized_alone && vector != nullptr) {
          // Decoded and rounded to T in one pass, a part at a time: the next row's bytes are
          // asked for while the part's output is written.
          for (std::int64_t j0 = 0; j0 < dim; j0 += kQuantPart) {
            const std::int64_t j1 = std::min(dim, j0 + kQuantPart);
            if (next_row) prefetch_quant_part(p.quant, ahead.token, j0, j1, dim);
            vector->dequantize_row_rounded(p.quant, r.token, j0, j1, p.scale, out, stream);
          }
          continue;
        }
        if (next_row) prefetch_quant_part(p.quant, ahead.token, 0, dim, dim);
        if (vector != nullptr) {
          vector->dequantize_row(p.quant, r.token, 0, dim, p.scale, a, false);
        } else {
          dequantize_row(p.quant, r.token, 0, dim, p.scale, a);
        }
      } else if (token != nullptr) {
#pragma omp simd
        for (std::int64_t j = 0; j < dim; ++j) a[j] = p.scale * to_float(token[j]);
      } else {
        std::fill(a, a + dim, 0.0f);
      }
      if (src.position != nullptr) {
        const T* pos = src.position;
#pragma omp simd
        for (std::int64_t j = 0; j < dim; ++j) a[j] += to_float(pos[j]);
      } else if (sinusoidal) {
        const std::int64_t half = dim / 2;
        const bool split = sinusoid_row.split;
#pragma omp simd
        for (std::int64_t i = 0; i < half; ++i) {
          float sin_v, cos_v;
          sinusoid_pair(sinusoid_row, i, &sin_v, &cos_v);
          a[split ? i : 2 * i] += sin_v;
          a[split ? half + i : 2 * i + 1] += cos_v;
        }
      }
      if (src.type != nullptr) {
        const T* type = src.type;
#pragma omp simd
        for (std::int64_t j = 0; j < dim; ++j) a[j] += to_float(type[j]);
      }
      if (norm) {
        normalize_row(p, r, a, out, norm_weight.data(), norm_bias.data(), vector, stream);
        continue;
      }
      if (vector != nullptr) {  // a quantized table's row
        vector->round_row(out, a, dim, stream);
        continue;
      }
#pragma omp simd
      for (std::int64_t j = 0; j < dim; ++j) out[j] = from_float<T>(a[j]);
    }
    if (stream && vector != nullptr) fence_streaming_stores();
  }

  internal::lower_bad_index(p.bad, first_bad, internal::BadIndexOp::embed, [&](std::int64_t key) {
    return internal::resolve_embed_row(p, internal::bad_index_row(key)).bad;
  });
}

}  // namespace

void embed(const internal::EmbedParams& p) {
  const Isa isa = active_isa();
  internal::dispatch_value_dtype(p.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const VectorBody<T>* vector = nullptr;
#if EMBROPE_CPU_X86
    static const VectorBody<T> avx512_body = avx512::vector_body<T>();
    static const VectorBody<T> avx2_body = avx2::vector_body<T>();
    if (isa >= Isa::avx512) vector = &avx512_body;
    if constexpr (std::is_same_v<T, detail::BFloat16>) {
      static const VectorBody<T> avx512_bf16_body = avx512_bf16::vector_body<T>();
      if (isa == Isa::avx512_bf16) vector = &avx512_bf16_body;
    }
    if (isa == Isa::avx2) vector = &avx2_body;
#endif
    (void)isa;
    embed_kernel<T>(p, vector);
  });
}

}  // namespace embrope::cpu
