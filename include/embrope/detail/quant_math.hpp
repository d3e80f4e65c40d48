// Dequantization of embedding rows stored in GGUF blocks, written once for both backends:
// the value of element e of a block, in float32, with the operations of the gguf package's
// `gguf.quants` (llama.cpp's gguf-py, the reference the tests compare with bit for bit) and of
// llama.cpp's dequantize_row_* (ggml-quants.c) compiled without multiply-add contraction.
//
// Block layouts, as llama.cpp's ggml-common.h declares them (packed, little-endian; the
// float16 scales are IEEE binary16):
//   Q8_0  32 values in 34 bytes:  half d; int8 qs[32]                  x = d * qs[e]
//   Q4_0  32 values in 18 bytes:  half d; uint8 qs[16]                 x = d * (q - 8)
//         q: the low nibble of qs[e] for e < 16, the high nibble of qs[e - 16] past it
//   Q4_K  256 values in 144 bytes: half d, dmin; uint8 scales[12]; uint8 qs[128]
//         eight sub-blocks of 32 with 6-bit scale s and min m (get_scale_min_k4):
//         x = (d * s) * q - (dmin * m), q a nibble of qs (sub-blocks 2i and 2i + 1 share
//         qs[32 i .. 32 i + 31]: low nibbles, then high nibbles)
//   Q6_K  256 values in 210 bytes: uint8 ql[128], qh[64]; int8 scales[16]; half d
//         x = (d * scales[e / 16]) * (q - 32), q six bits: four from ql, two from qh
// Blocks need no alignment (the formulas take bytes); the float16 scales are widened
// exactly, and each x is rounded once per operation in the order written.
#pragma once

#include <cstdint>

#include "embrope/detail/config.hpp"
#include "embrope/detail/numeric_types.hpp"

namespace embrope::detail {

enum class GgufBlock { q8_0, q4_0, q4_k, q6_k };

// Values per block and bytes per block.
EMBROPE_HD constexpr int gguf_block_values(GgufBlock f) {
  return f == GgufBlock::q4_k || f == GgufBlock::q6_k ? 256 : 32;
}
EMBROPE_HD constexpr int gguf_block_bytes(GgufBlock f) {
  return f == GgufBlock::q8_0 ? 34 : f == GgufBlock::q4_0 ? 18 : f == GgufBlock::q4_k ? 144 : 210;
}

// A quantized integer (|q| < 2^22: every q, scale and min here has at most 8 bits) as float32,
// exactly. On the GPU by an integer add and a float subtract, which issue at 64 and 128 per
// clock per SM on sm_90, where the I2F conversion issues at 16 (the CUDA C++ Programming
// Guide's throughput table): the bits of 1.5 * 2^23 + q are that float exactly (its last place
// is 1), and subtracting 1.5 * 2^23 is exact (Sterbenz; the trick of FasterTransformer's and
// LMDeploy's int-to-float dequantizers).
EMBROPE_HD float small_int_to_float(int q) {
#if defined(__CUDA_ARCH__)
  constexpr std::uint32_t kMagicBits = 0x4B400000u;  // 12582912.0f = 1.5 * 2^23
  return __fsub_rn(bits_float(kMagicBits + static_cast<std::uint32_t>(q)), 12582912.0f);
#else
  return static_cast<float>(q);
#endif
}

// A little-endian float16 at p, widened.
EMBROPE_HD float gguf_half(const std::uint8_t* p) {
  return half_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
}

// Each format in three parts, so that a row loop can take a block's (or sub-block's) scale
// once and the quantized integers one by one: the scale factors, the integer q of element e, and
// the value from both. *_value(block, e) composes them for one element.

// Q8_0 and Q4_0: x = d * q.
EMBROPE_HD int q8_0_quant(const std::uint8_t* block, int e) {
  return static_cast<std::int8_t>(block[2 + e]);
}
// Q4_0's element e from its byte, block[2 + (e & 15)].
EMBROPE_HD int q4_0_from_byte(std::uint8_t byte, int e) {
  return (e < 16 ? byte & 0x0f : byte >> 4) - 8;
}
EMBROPE_HD int q4_0_quant(const std::uint8_t* block, int e) {
  return q4_0_from_byte(block[2 + (e & 15)], e);
}
EMBROPE_HD float scaled_value(float d, int q) {
  return d * small_int_to_float(q);
}
EMBROPE_HD float q8_0_value(const std::uint8_t* block, int e) {
  return scaled_value(gguf_half(block), q8_0_quant(block, e));
}
EMBROPE_HD float q4_0_value(const std::uint8_t* block, int e) {
  return scaled_value(gguf_half(block), q4_0_quant(block, e));
}

// Sub-block j's (0 <= j < 8) 6-bit scale and min from Q4_K's 12 packed bytes: j < 4 in the low
// six bits of bytes j and j + 4; past that, four low bits from byte j + 4 and two high bits
// from the top of bytes j - 4 (scale) and j (min). ggml-quants.c, get_scale_min_k4.
EMBROPE_HD void q4_k_scale_min(const std::uint8_t* scales, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
    *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Q4_K: sub-block `sub` (32 values) has x = d * q - m.
struct Q4kFactors {
  float d, m;
};
// d and dmin: the block's two float16 fields, widened (a row loop widens them once a block).
EMBROPE_HD Q4kFactors q4_k_factors(float d, float dmin, const std::uint8_t* block, int sub) {
  int scale, min;
  q4_k_scale_min(block + 4, sub, &scale, &min);
  return {d * small_int_to_float(scale), dmin * small_int_to_float(min)};
}
EMBROPE_HD Q4kFactors q4_k_factors(const std::uint8_t* block, int sub) {
  return q4_k_factors(gguf_half(block), gguf_half(block + 2), block, sub);
}
// Value l (0..31) of sub-block sub, and element e.
// Sub-block sub's value from its byte, block[16 + 32 (sub / 2) + l].
EMBROPE_HD int q4_k_from_byte(std::uint8_t byte, int sub) {
  return (sub & 1) == 0 ? byte & 0x0f : byte >> 4;
}
EMBROPE_HD int q4_k_quant(const std::uint8_t* block, int sub, int l) {
  return q4_k_from_byte(block[16 + 32 * (sub / 2) + l], sub);
}
EMBROPE_HD int q4_k_quant(const std::uint8_t* block, int e) {
  return q4_k_quant(block, e / 32, e & 31);
}
EMBROPE_HD float q4_k_apply(Q4kFactors f, int q) {
#if defined(__CUDA_ARCH__)
  // The product and the difference each rounded, whatever -fmad a unit is built with. (With
  // float16 d and dmin, 6-bit factors and 4-bit q every product here is exact, so a fused
  // multiply-add would give the same value; the intrinsics keep that from being a premise.)
  return __fsub_rn(__fmul_rn(f.d, small_int_to_float(q)), f.m);
#else
  return f.d * small_int_to_float(q) - f.m;
#endif
}
EMBROPE_HD float q4_k_value(const std::uint8_t* block, int e) {
  return q4_k_apply(q4_k_factors(block, e / 32), q4_k_quant(block, e));
}

// Q6_K: each half of 128 values reads 64 bytes of ql and 32 of qh. Within a half, value
// 32 k + l (k = 0..3, l = 0..31) is, as ggml's dequantize_row_q6_K writes y[l + 32 k]: the
// low nibble of ql[l] (k = 0), of ql[l + 32] (k = 1), the high nibble of ql[l] (k = 2), of
// ql[l + 32] (k = 3), with bits 2 k and 2 k + 1 of qh[l] above them. x = (d * scales[e / 16])
// * q, the factor shared by 16 values.
EMBROPE_HD float q6_k_factor(float d, std::int8_t scale) {
  return d * small_int_to_float(scale);
}
EMBROPE_HD float q6_k_factor(const std::uint8_t* block, int e) {
  return q6_k_factor(gguf_half(block + 208), static_cast<std::int8_t>(block[192 + e / 16]));
}
// Value 32 k + l of half `half`, and element e.
// Value 32 k + l of a half from its two bytes, low = ql[l + 32 (k & 1)] and high = qh[l].
EMBROPE_HD int q6_k_from_bytes(std::uint8_t low, std::uint8_t high, int k) {
  return ((k < 2 ? low & 0x0f : low >> 4) | (((high >> (2 * k)) & 3) << 4)) - 32;
}
EMBROPE_HD int q6_k_quant(const std::uint8_t* block, int half, int k, int l) {
  const std::uint8_t* ql = block + 64 * half;
  const std::uint8_t* qh = block + 128 + 32 * half;
  return q6_k_from_bytes(ql[l + 32 * (k & 1)], qh[l], k);
}
EMBROPE_HD int q6_k_quant(const std::uint8_t* block, int e) {
  return q6_k_quant(block, e / 128, (e % 128) / 32, e % 32);
}
EMBROPE_HD float q6_k_value(const std::uint8_t* block, int e) {
  return scaled_value(q6_k_factor(block, e), q6_k_quant(block, e));
}

// Element e (0 <= e < gguf_block_values(f)) of the block at `block`.
EMBROPE_HD float gguf_value(GgufBlock f, const std::uint8_t* block, int e) {
  switch (f) {
    case GgufBlock::q8_0:
      return q8_0_value(block, e);
    case GgufBlock::q4_0:
      return q4_0_value(block, e);
    case GgufBlock::q4_k:
      return q4_k_value(block, e);
    case GgufBlock::q6_k:
    default:  // every value has its case (-Wswitch-enum); a return on every path for the compilers
      return q6_k_value(block, e);
  }
}

// ------------------------------------------------- integer rows with scales (affine) ----
// int8 rows (ExecuTorch's embedding_byte; torchao's IntxWeightOnlyConfig keeps int8 and int4
// values one per byte) and packed int4 rows (ExecuTorch's embedding_4bit), with a scale and an
// optional zero point per row or per group of columns: x = (q - zero_point) * scale in float32,
// ExecuTorch's kernels' order (op_embedding.cpp, embeddingxb.cpp) and torchao's
// (_dequantize_affine: (q - zp) * scale). q and the zero point are small integers, exact in
// float32, so the subtraction is exact and the product rounds once.
EMBROPE_HD float affine_value(int q, float zero_point, float scale) {
  return (small_int_to_float(q) - zero_point) * scale;
}

// Element e of a packed int4 row as ExecuTorch's embedding_4bit packs it: two per byte, the
// even element in the high nibble and the odd one in the low, each stored plus 8
// ((q[2k] + 8) << 4 | (q[2k + 1] + 8)); q in [-8, 7]. (GGUF's Q4_0 differs: halves of a block
// in the low and high nibbles.)
EMBROPE_HD int int4_high_value(std::uint8_t byte) {  // the even element
  return (byte >> 4) - 8;
}
EMBROPE_HD int int4_low_value(std::uint8_t byte) {  // the odd element
  return (byte & 0x0f) - 8;
}
EMBROPE_HD int int4_packed_value(const std::uint8_t* row, std::int64_t e) {
  const std::uint8_t byte = row[e >> 1];
  return (e & 1) == 0 ? int4_high_value(byte) : int4_low_value(byte);
}

}  // namespace embrope::detail
