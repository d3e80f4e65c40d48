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

// N consecutive bytes of a quantized row at p into b[0, N): as few loads as p's alignment
// allows (8, 4 or 2 bytes, else one at a time; rows and GGUF blocks start anywhere). On the
// GPU a warp's request for its lanes' chunks then reads each sector once, where a byte at a time
// made a request per byte, each touching every sector of the warp's span (the emulated memory
// model's L1 sectors per DRAM sector; tests/gpu/test_embed.cpp's model case).
template <int N>
EMBROPE_HD void load_quant_bytes(const std::uint8_t* p, std::uint8_t* b) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  const auto unpack = [&](std::uint64_t word, int from, int bytes) {
    for (int i = 0; i < bytes; ++i) b[from + i] = static_cast<std::uint8_t>(word >> (8 * i));
  };
  if (N % 8 == 0 && at % 8 == 0) {
    for (int k = 0; k < N / 8; ++k) unpack(reinterpret_cast<const std::uint64_t*>(p)[k], 8 * k, 8);
  } else if (N % 4 == 0 && at % 4 == 0) {
    for (int k = 0; k < N / 4; ++k) unpack(reinterpret_cast<const std::uint32_t*>(p)[k], 4 * k, 4);
  } else if (N % 2 == 0 && at % 2 == 0) {
    for (int k = 0; k < N / 2; ++k) unpack(reinterpret_cast<const std::uint16_t*>(p)[k], 2 * k, 2);
  } else {
    for (int i = 0; i < N; ++i) b[i] = p[i];
  }
}

// Values j .. j + W - 1 of table row `row`, dequantized into v: the group's (or block's)
// position, scale and zero point found once per chunk, the chunk's bytes loaded together
// (load_quant_bytes), then each value by the element formula (W 1: any j; W > 1: j a multiple
// of W and quant_chunks_fit).
template <int W>
EMBROPE_HD void quant_table_chunk(const QuantTable& q, std::int64_t row, std::int64_t j, float* v) {
  const std::uint8_t* r = q.data + row * q.row_stride;
  // int4 and Q4_0 chunks of one value read a byte (not half of one).
  constexpr int kNibbleBytes = W > 1 ? W / 2 : 1;
  if (is_gguf_format(q.format)) {
    const detail::GgufBlock kind = gguf_block_of(q.format);
    const std::int64_t values = detail::gguf_block_values(kind);
    const std::int64_t b = j / values;
    const int e0 = static_cast<int>(j - b * values);
    const std::uint8_t* block = r + b * detail::gguf_block_bytes(kind);
    std::uint8_t bytes[W];
    // Q8_0's and Q4_0's d in one load. (A copy of Q4_K's 16 leading bytes, d, dmin and the
    // packed scales, went to local memory: q4_k_factors indexes them by the sub-block.)
    if (kind == detail::GgufBlock::q8_0) {
      load_quant_bytes<W>(block + 2 + e0, bytes);
      std::uint8_t d_bytes[2];
      load_quant_bytes<2>(block, d_bytes);
      const float d = detail::gguf_half(d_bytes);
      for (int w = 0; w < W; ++w)
        v[w] = detail::scaled_value(d, static_cast<std::int8_t>(bytes[w]));
    } else if (kind == detail::GgufBlock::q4_0) {  // a chunk lies in one half: one nibble each
      load_quant_bytes<W>(block + 2 + (e0 & 15), bytes);
      std::uint8_t d_bytes[2];
      load_quant_bytes<2>(block, d_bytes);
      const float d = detail::gguf_half(d_bytes);
      for (int w = 0; w < W; ++w)
        v[w] = detail::scaled_value(d, detail::q4_0_from_byte(bytes[w], e0 + w));
    } else if (kind == detail::GgufBlock::q4_k) {
      const int sub = e0 / 32;
      load_quant_bytes<W>(block + 16 + 32 * (sub / 2) + (e0 & 31), bytes);
      const detail::Q4kFactors f = detail::q4_k_factors(block, sub);
      for (int w = 0; w < W; ++w)
        v[w] = detail::q4_k_apply(f, detail::q4_k_from_byte(bytes[w], sub));
    } else {
      const int half = e0 / 128, k = (e0 % 128) / 32, l = e0 % 32;
      std::uint8_t high[W];
      load_quant_bytes<W>(block + 64 * half + 32 * (k & 1) + l, bytes);
      load_quant_bytes<W>(block + 128 + 32 * half + l, high);
      const float d = detail::q6_k_factor(block, e0);
      for (int w = 0; w < W; ++w)
        v[w] = detail::scaled_value(d, detail::q6_k_from_bytes(bytes[w], high[w], k));
    }
    return;
  }
  const std::int64_t group = j / q.group_size;
  const float scale = load_vector_value(q.scales, q.scale_dtype, row * q.scale_stride + group);
  if (q.format == QuantFormat::float8_e4m3fn || q.format == QuantFormat::float8_e5m2) {
    const bool e4 = q.format == QuantFormat::float8_e4m3fn;
    std::uint8_t codes[W];
    load_quant_bytes<W>(r + j, codes);
    for (int w = 0; w < W; ++w) {
      const std::uint8_t c = codes[w];
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
  if (q.format == QuantFormat::int8) {
    std::uint8_t bytes[W];
    load_quant_bytes<W>(r + j, bytes);
    for (int w = 0; w < W; ++w) {
      v[w] = detail::affine_value(static_cast<std::int8_t>(bytes[w]), zero_point, scale);
    }
    return;
  }
  // int4: W > 1 starts on a byte (j even, W even), a value alone may be either nibble.
  std::uint8_t pairs[kNibbleBytes];
  load_quant_bytes<kNibbleBytes>(r + j / 2, pairs);
  for (int w = 0; w < W; ++w) {
    const std::uint8_t byte = pairs[W > 1 ? w / 2 : 0];
    const int value =
        ((j + w) & 1) == 0 ? detail::int4_high_value(byte) : detail::int4_low_value(byte);
    v[w] = detail::affine_value(value, zero_point, scale);
  }
}

}  // namespace embrope::internal
