// The values of a quantized token table (embed with a QuantizedTable), shared by the backends:
// where element j of a row and its scale and zero point are, and its float32 value by the
// format's formula (detail/quant_math.hpp; QuantFormat in types.hpp).
#pragma once

#include <cstdint>

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

// A zero point of any of its dtypes (float32, float16, bfloat16, int8, int32), as float32
// (the integer ones exactly).
EMBROPE_HD float load_zero_point(const void* base, DType dtype, std::int64_t at) {
  if (dtype == DType::int8) return static_cast<float>(static_cast<const std::int8_t*>(base)[at]);
  if (dtype == DType::int32) return static_cast<float>(static_cast<const std::int32_t*>(base)[at]);
  return load_vector_value(base, dtype, at);
}

// Whether chunks of W consecutive values (starting at multiples of W) each lie in one group of
// a scale, or one run of a GGUF block that shares its factors (16 values: Q6_K's scales; the
// other formats' runs are longer): quant_table_chunk<W>'s precondition.
EMBROPE_HD bool quant_chunks_fit(const QuantTable& q, int w) {
  return is_gguf_format(q.format) ? 16 % w == 0 : q.group_size % w == 0;
}

// Values j .. j + W - 1 of table row `row`, dequantized into v: the group's (or block's)
// position, scale and zero point found once per chunk, then each value by the element formula
// (W 1: any j; W > 1: j a multiple of W and quant_chunks_fit).
template <int W>
EMBROPE_HD void quant_table_chunk(const QuantTable& q, std::int64_t row, std::int64_t j, float* v) {
  const std::uint8_t* r = q.data + row * q.row_stride;
  if (is_gguf_format(q.format)) {
    const detail::GgufBlock kind = gguf_block_of(q.format);
    const std::int64_t values = detail::gguf_block_values(kind);
    const std::int64_t b = j / values;
    const int e0 = static_cast<int>(j - b * values);
    const std::uint8_t* block = r + b * detail::gguf_block_bytes(kind);
    if (kind == detail::GgufBlock::q8_0 || kind == detail::GgufBlock::q4_0) {
      const float d = detail::gguf_half(block);
      const bool q8 = kind == detail::GgufBlock::q8_0;
      for (int w = 0; w < W; ++w) {
        const int e = e0 + w;
        v[w] = detail::scaled_value(
            d, q8 ? detail::q8_0_quant(block, e) : detail::q4_0_quant(block, e));
      }
    } else if (kind == detail::GgufBlock::q4_k) {
      const detail::Q4kFactors f = detail::q4_k_factors(block, e0 / 32);
      for (int w = 0; w < W; ++w) v[w] = detail::q4_k_apply(f, detail::q4_k_quant(block, e0 + w));
    } else {
      const float d = detail::q6_k_factor(block, e0);
      for (int w = 0; w < W; ++w) v[w] = detail::scaled_value(d, detail::q6_k_quant(block, e0 + w));
    }
    return;
  }
  const std::int64_t group = j / q.group_size;
  const float scale = load_vector_value(q.scales, q.scale_dtype, row * q.scale_stride + group);
  if (q.format == QuantFormat::float8_e4m3fn || q.format == QuantFormat::float8_e5m2) {
    const bool e4 = q.format == QuantFormat::float8_e4m3fn;
    for (int w = 0; w < W; ++w) {
      const std::uint8_t c = r[j + w];
      v[w] =
          (e4 ? detail::to_float(detail::Float8E4M3{c}) : detail::to_float(detail::Float8E5M2{c})) *
          scale;
    }
    return;
  }
  const float zero_point =
      q.zero_points == nullptr
          ? 0.0f
          : load_zero_point(q.zero_points, q.zero_point_dtype, row * q.zero_point_stride + group);
  const bool int8 = q.format == QuantFormat::int8;
  for (int w = 0; w < W; ++w) {
    const int value = int8 ? static_cast<int>(static_cast<std::int8_t>(r[j + w]))
                           : detail::int4_packed_value(r, j + w);
    v[w] = detail::affine_value(value, zero_point, scale);
  }
}

}  // namespace embrope::internal
