// The values of a quantized token table (embed with a QuantizedTable), shared by the backends:
// where element j of a row and its scale and zero point are, and its float32 value by the
// format's formula (detail/quant_math.hpp; QuantFormat in types.hpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "embed_params.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/quant_math.hpp"
#include "tensor_access.hpp"

namespace embrope::internal {

// The GGUF block layout of a GGUF format (quant_math.hpp's enum).
EMBROPE_HD constexpr detail::GgufBlock gguf_block_of(QuantFormat f) {
  return f == QuantFormat::gguf_q8_0   ? detail::GgufBlock::q8_0
         : f == QuantFormat::gguf_q4_0 ? detail::GgufBlock::q4_0
         : f == QuantFormat::gguf_q4_k ? detail::GgufBlock::q4_k
                                       : detail::GgufBlock::q6_k;
}
EMBROPE_HD constexpr bool is_gguf_format(QuantFormat f) {
  return f == QuantFormat::gguf_q8_0 || f == QuantFormat::gguf_q4_0 ||
         f == QuantFormat::gguf_q4_k || f == QuantFormat::gguf_q6_k;
}

// Whether chunks of W consecutive values (starting at multiples of W) each lie in one group of
// a scale, or one run of a GGUF block that shares its factors (16 values: Q6_K's scales; the
// other formats' runs are longer): quant_table_chunk<W>'s precondition.
EMBROPE_HD bool quant_chunks_fit(const QuantTable& q, int w) {
  return is_gguf_format(q.format) ? 16 % w == 0 : q.group_size % w == 0;
}

// The alignment (1, 2, 4 or 8 bytes) of every W-value chunk's bytes in a row that starts on a
// multiple of it: W-value chunks start at multiples of W (quant_chunks_fit), so int8's and
// float8's lie at r + j, int4's at r + j / 2, Q4_K's at 16-byte offsets in 144-byte blocks plus
// a multiple of W; Q8_0's, Q4_0's and Q6_K's blocks (34, 18 and 210 bytes) keep 2. The GPU
// loads a chunk in accesses of this size (load_quant_bytes), which the row's start and stride
// must allow (quant_rows_aligned); a chunk of one value reads bytes.
EMBROPE_HD constexpr int quant_chunk_granule(QuantFormat f, int w) {
  const int bytes = f == QuantFormat::int4 ? w / 2 : w;  // bytes of a chunk's values
  const int cap =
      f == QuantFormat::gguf_q8_0 || f == QuantFormat::gguf_q4_0 || f == QuantFormat::gguf_q6_k ? 2
                                                                                                : 8;
  int granule = 1;
  while (granule * 2 <= cap && granule * 2 <= bytes) granule *= 2;
  return granule;
}
// Whether every row of the table starts on a multiple of the granule.
inline bool quant_rows_aligned(const QuantTable& q, int w) {
  const auto granule = static_cast<std::uintptr_t>(quant_chunk_granule(q.format, w));
  return reinterpret_cast<std::uintptr_t>(q.data) % granule == 0 &&
         static_cast<std::uintptr_t>(q.row_stride) % granule == 0;
}

// N bytes of a quantized row, kept in the 32-bit words they were loaded into and taken apart
// only when converted (operator[]): a lane issues the loads of several chunks before it uses the
// first (cuda/embed.cu's quantized_row), where unpacking each chunk's bytes as it arrived made
// the lane wait for each load in turn.
template <int N>
struct QuantBytes {
  std::uint32_t word[(N + 3) / 4] = {};
  EMBROPE_HD std::uint8_t operator[](int i) const {
    return static_cast<std::uint8_t>(word[i / 4] >> (8 * (i % 4)));
  }
};

// N bytes at p (a multiple of A, a power of two up to 8) into the first N bytes of b, in
// accesses of A bytes (fewer where N is smaller); little-endian, as GGUF and the GPU are.
template <int A, int N, int M>
EMBROPE_HD void load_quant_bytes(const std::uint8_t* p, QuantBytes<M>& b) {
  static_assert(N <= M, "the chunk's bytes fit");
  constexpr int kAccess = A >= 8 && N % 8 == 0   ? 8
                          : A >= 4 && N % 4 == 0 ? 4
                          : A >= 2 && N % 2 == 0 ? 2
                                                 : 1;
  for (int i = 0; i < (N + 3) / 4; ++i) b.word[i] = 0;
  for (int k = 0; k < N / kAccess; ++k) {
    if constexpr (kAccess == 8) {
      const std::uint64_t w = reinterpret_cast<const std::uint64_t*>(p)[k];
      b.word[2 * k] = static_cast<std::uint32_t>(w);
      b.word[2 * k + 1] = static_cast<std::uint32_t>(w >> 32);
    } else if constexpr (kAccess == 4) {
      b.word[k] = reinterpret_cast<const std::uint32_t*>(p)[k];
    } else if constexpr (kAccess == 2) {
      b.word[k / 2] |= static_cast<std::uint32_t>(reinterpret_cast<const std::uint16_t*>(p)[k])
                       << (16 * (k % 2));
    } else {
      b.word[k / 4] |= static_cast<std::uint32_t>(p[k]) << (8 * (k % 4));
    }
  }
}

// The bits of a little-endian float16 at p (a multiple of A).
template <int A>
EMBROPE_HD std::uint32_t load_quant_half_bits(const std::uint8_t* p) {
  if constexpr (A >= 2) {
    return *reinterpret_cast<const std::uint16_t*>(p);
  } else {
    return static_cast<std::uint32_t>(p[0] | (p[1] << 8));
  }
}

// j's group of group_size columns: a shift where the groups allow one (group_shift), else a
// division in 32 bits where both fit (a GPU divides 64-bit integers in a call of some 70
// instructions, 32-bit ones in some 20; this runs once per chunk).
EMBROPE_HD std::int64_t quant_group_of(const QuantTable& q, std::int64_t j) {
  if (q.group_shift >= 0) return j >> q.group_shift;
  if (((j | q.group_size) >> 32) == 0) {
    return static_cast<std::uint32_t>(j) / static_cast<std::uint32_t>(q.group_size);
  }
  return j / q.group_size;
}

// A scale's or zero point's bits as loaded (at most 32: float32, float16, bfloat16, int8,
// int32), and its value: split so that the widening waits for the load only where the chunk is
// converted.
EMBROPE_HD std::uint32_t load_factor_bits(const void* base, DType dtype, std::int64_t at) {
  switch (dtype) {
    case DType::float16:
    case DType::bfloat16:
      return static_cast<const std::uint16_t*>(base)[at];
    case DType::int8:
      return static_cast<const std::uint8_t*>(base)[at];
    default:  // float32, int32
      return static_cast<const std::uint32_t*>(base)[at];
  }
}
EMBROPE_HD float factor_value(std::uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::float16:
      return detail::to_float(detail::Half{static_cast<std::uint16_t>(bits)});
    case DType::bfloat16:
      return detail::to_float(detail::BFloat16{static_cast<std::uint16_t>(bits)});
    case DType::int8:
      return detail::small_int_to_float(static_cast<std::int8_t>(bits));
    case DType::int32:
      return static_cast<float>(static_cast<std::int32_t>(bits));
    default: {
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
}

// A zero point of any of its dtypes (float32, float16, bfloat16, int8, int32), as float32
// (the integer ones exactly).
EMBROPE_HD float load_zero_point(const void* base, DType dtype, std::int64_t at) {
  return factor_value(load_factor_bits(base, dtype, at), dtype);
}

// Values j .. j + W - 1 of a row of format F as loaded (quant_chunk_load): their bytes (int4:
// W / 2 of them, or 1 for one value; Q6_K also qh's), and the factors they share, as bits
// where a widening would wait for their load (the scale's and the zero point's; Q8_0's and
// Q4_0's d; Q6_K's d and, above it, the 16 values' int8 scale), as values for Q4_K (d and dmin
// times the sub-block's scale and min: its packed scales are indexed by the sub-block).
template <int W>
struct QuantChunk {
  QuantBytes<W> bytes;
  QuantBytes<W> high;
  std::uint32_t scale_bits = 0, offset_bits = 0;
  detail::Q4kFactors q4k{0.0f, 0.0f};
};

// The loads of values j .. j + W - 1 of table row `row` (W 1: any j; W > 1: j a multiple of W,
// quant_chunks_fit, and the rows aligned to quant_chunk_granule): the chunk's group or block
// found once, its bytes in accesses of the granule, its factors.
template <QuantFormat F, int W>
EMBROPE_HD QuantChunk<W> quant_chunk_load(const QuantTable& q, std::int64_t row, std::int64_t j) {
  constexpr int A = quant_chunk_granule(F, W);
  QuantChunk<W> c;
  const std::uint8_t* r = q.data + row * q.row_stride;
  if constexpr (is_gguf_format(F)) {
    constexpr detail::GgufBlock kind = gguf_block_of(F);
    constexpr int values = detail::gguf_block_values(kind);
    const std::int64_t b = j / values;
    const int e0 = static_cast<int>(j - b * values);
    const std::uint8_t* block = r + b * detail::gguf_block_bytes(kind);
    if constexpr (kind == detail::GgufBlock::q8_0) {
      load_quant_bytes<A, W>(block + 2 + e0, c.bytes);
      c.scale_bits = load_quant_half_bits<A>(block);
    } else if constexpr (kind == detail::GgufBlock::q4_0) {  // one half: a nibble each
      load_quant_bytes<A, W>(block + 2 + (e0 & 15), c.bytes);
      c.scale_bits = load_quant_half_bits<A>(block);
    } else if constexpr (kind == detail::GgufBlock::q4_k) {
      const int sub = e0 / 32;
      load_quant_bytes<A, W>(block + 16 + 32 * (sub / 2) + (e0 & 31), c.bytes);
      // (A copy of the block's 16 leading bytes, d, dmin and the packed scales, went to local
      // memory: q4_k_factors indexes them by the sub-block.)
      c.q4k = detail::q4_k_factors(block, sub);
    } else {
      const int half = e0 / 128, k = (e0 % 128) / 32, l = e0 % 32;
      load_quant_bytes<A, W>(block + 64 * half + 32 * (k & 1) + l, c.bytes);
      load_quant_bytes<A, W>(block + 128 + 32 * half + l, c.high);
      c.scale_bits = load_quant_half_bits<A>(block + 208) |
                     static_cast<std::uint32_t>(block[192 + e0 / 16]) << 16;
    }
  } else {
    const std::int64_t group = quant_group_of(q, j);
    c.scale_bits = load_factor_bits(q.scales, q.scale_dtype, row * q.scale_stride + group);
    if constexpr (F == QuantFormat::float8_e4m3fn || F == QuantFormat::float8_e5m2) {
      load_quant_bytes<A, W>(r + j, c.bytes);
    } else {
      if (q.zero_points != nullptr) {
        c.offset_bits =
            load_factor_bits(q.zero_points, q.zero_point_dtype, row * q.zero_point_stride + group);
      }
      if constexpr (F == QuantFormat::int8) {
        load_quant_bytes<A, W>(r + j, c.bytes);
      } else {  // int4: W > 1 starts on a byte (j even, W even), a value alone either nibble
        load_quant_bytes<A, (W > 1 ? W / 2 : 1)>(r + j / 2, c.bytes);
      }
    }
  }
  return c;
}

// Values j .. j + W - 1 from their loaded chunk, by the format's element formula
// (detail/quant_math.hpp), into v.
template <QuantFormat F, int W>
EMBROPE_HD void quant_chunk_values(const QuantTable& q, const QuantChunk<W>& c, std::int64_t j,
                                   float* v) {
  if constexpr (is_gguf_format(F)) {
    constexpr detail::GgufBlock kind = gguf_block_of(F);
    const int e0 = static_cast<int>(j % detail::gguf_block_values(kind));
    const float d = detail::half_to_float(static_cast<std::uint16_t>(c.scale_bits));
    for (int w = 0; w < W; ++w) {
      if constexpr (kind == detail::GgufBlock::q8_0) {
        v[w] = detail::scaled_value(d, static_cast<std::int8_t>(c.bytes[w]));
      } else if constexpr (kind == detail::GgufBlock::q4_0) {
        v[w] = detail::scaled_value(d, detail::q4_0_from_byte(c.bytes[w], e0 + w));
      } else if constexpr (kind == detail::GgufBlock::q4_k) {
        v[w] = detail::q4_k_apply(c.q4k, detail::q4_k_from_byte(c.bytes[w], e0 / 32));
      } else {
        const float factor = detail::q6_k_factor(d, static_cast<std::int8_t>(c.scale_bits >> 16));
        v[w] = detail::scaled_value(
            factor, detail::q6_k_from_bytes(c.bytes[w], c.high[w], (e0 % 128) / 32));
      }
    }
  } else {
    const float scale = factor_value(c.scale_bits, q.scale_dtype);
    if constexpr (F == QuantFormat::float8_e4m3fn) {
      for (int w = 0; w < W; ++w) v[w] = detail::to_float(detail::Float8E4M3{c.bytes[w]}) * scale;
    } else if constexpr (F == QuantFormat::float8_e5m2) {
      for (int w = 0; w < W; ++w) v[w] = detail::to_float(detail::Float8E5M2{c.bytes[w]}) * scale;
    } else {
      const float zero_point =
          q.zero_points == nullptr ? 0.0f : factor_value(c.offset_bits, q.zero_point_dtype);
      for (int w = 0; w < W; ++w) {
        int value;
        if constexpr (F == QuantFormat::int8) {
          value = static_cast<std::int8_t>(c.bytes[w]);
        } else {
          const std::uint8_t byte = c.bytes[W > 1 ? w / 2 : 0];
          value = ((j + w) & 1) == 0 ? detail::int4_high_value(byte) : detail::int4_low_value(byte);
        }
        v[w] = detail::affine_value(value, zero_point, scale);
      }
    }
  }
}

// Runs the statements that follow with the constant kFormat = format, a QuantFormat known at
// run time: the format dispatch of device code (a switch; its cases compile separately).
#define EMBROPE_DISPATCH_QUANT_FORMAT(format, kFormat, ...)        \
  switch (format) {                                                \
    EMBROPE_QUANT_FORMAT_CASE(int8, kFormat, __VA_ARGS__)          \
    EMBROPE_QUANT_FORMAT_CASE(int4, kFormat, __VA_ARGS__)          \
    EMBROPE_QUANT_FORMAT_CASE(float8_e4m3fn, kFormat, __VA_ARGS__) \
    EMBROPE_QUANT_FORMAT_CASE(float8_e5m2, kFormat, __VA_ARGS__)   \
    EMBROPE_QUANT_FORMAT_CASE(gguf_q8_0, kFormat, __VA_ARGS__)     \
    EMBROPE_QUANT_FORMAT_CASE(gguf_q4_0, kFormat, __VA_ARGS__)     \
    EMBROPE_QUANT_FORMAT_CASE(gguf_q4_k, kFormat, __VA_ARGS__)     \
    EMBROPE_QUANT_FORMAT_CASE(gguf_q6_k, kFormat, __VA_ARGS__)     \
  }
#define EMBROPE_QUANT_FORMAT_CASE(name, kFormat, ...)  \
  case QuantFormat::name: {                            \
    constexpr QuantFormat kFormat = QuantFormat::name; \
    __VA_ARGS__;                                       \
  } break;

// Values j .. j + W - 1 of table row `row`, dequantized into v (quant_chunk_load's
// preconditions).
template <int W>
EMBROPE_HD void quant_table_chunk(const QuantTable& q, std::int64_t row, std::int64_t j, float* v) {
  EMBROPE_DISPATCH_QUANT_FORMAT(
      q.format, kFormat,
      quant_chunk_values<kFormat, W>(q, quant_chunk_load<kFormat, W>(q, row, j), j, v))
}

}  // namespace embrope::internal
