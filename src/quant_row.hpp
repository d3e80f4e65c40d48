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

// Element j of table row `row`, dequantized.
EMBROPE_HD float quant_table_value(const QuantTable& q, std::int64_t row, std::int64_t j) {
  const std::uint8_t* r = q.data + row * q.row_stride;
  if (is_gguf_format(q.format)) {
    const detail::GgufBlock block = gguf_block_of(q.format);
    const std::int64_t values = detail::gguf_block_values(block);
    const std::int64_t b = j / values;
    return detail::gguf_value(block, r + b * detail::gguf_block_bytes(block),
                              static_cast<int>(j - b * values));
  }
  const std::int64_t group = j / q.group_size;
  const float scale = load_vector_value(q.scales, q.scale_dtype, row * q.scale_stride + group);
  if (q.format == QuantFormat::float8_e4m3fn) {
    return detail::to_float(detail::Float8E4M3{r[j]}) * scale;
  }
  if (q.format == QuantFormat::float8_e5m2) {
    return detail::to_float(detail::Float8E5M2{r[j]}) * scale;
  }
  const int value = q.format == QuantFormat::int8 ? static_cast<int>(static_cast<std::int8_t>(r[j]))
                                                  : detail::int4_packed_value(r, j);
  const float zero_point =
      q.zero_points == nullptr
          ? 0.0f
          : load_zero_point(q.zero_points, q.zero_point_dtype, row * q.zero_point_stride + group);
  return detail::affine_value(value, zero_point, scale);
}

}  // namespace embrope::internal
