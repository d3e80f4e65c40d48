// Float vectors for the CPU kernels' x86 paths, one struct per instruction set (AVX2 with
// F16C; AVX-512; AVX-512 with AVX512_BF16). Loads widen float32, float16 and bfloat16 to
// float32 lanes; stores round back with exactly the rounding of the portable conversions
// (include/embrope/detail/numeric_types.hpp: nearest-even, NaN as the portable code writes
// it), and arithmetic is separate multiplies and adds as in detail/ (never FMA), so every
// path gives the portable path's bits. The selection at run time is in isa.hpp.
//
// Each function carries its instruction set as a target attribute rather than the file being
// compiled with -mavx2: nothing compiled here for AVX-512 can be linked into the portable
// path (an inline function emitted by a file built with wider flags may be picked by the
// linker for every caller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "embrope/detail/numeric_types.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EMBROPE_CPU_X86 1
#include <immintrin.h>
#define EMBROPE_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define EMBROPE_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define EMBROPE_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c")))
#define EMBROPE_SIMD_INLINE inline __attribute__((always_inline))
#else
#define EMBROPE_CPU_X86 0
#endif

// For a function whose only effect is prefetches: GCC's interprocedural analysis counts a
// prefetch as no side effect, takes such a function as const and deletes its calls (seen with
// GCC 12 at -O1 to -O3); noipa keeps them. (Clang keeps calls to a function that prefetches.)
// A prefetch loop inlined into a function that also does other work stays where it is.
#if defined(__GNUC__) && !defined(__clang__)
#define EMBROPE_PREFETCH_ONLY __attribute__((noipa))
#else
#define EMBROPE_PREFETCH_ONLY
#endif

namespace embrope::cpu {

// Asks for every cache line holding a byte of [base + from, base + to) in L2 (kLocality 2; 3:
// L1), for reading or (kWrite 1) writing: the rows of a gather lie at random addresses, and a
// partial rotation touches part of each row, where the hardware prefetchers restart. The
// first line is the one holding the first byte, wherever the range starts in it. The
// addresses are only asked for, never formed as pointers outside the range. Always inlined
// (a per-row loop pays no call); a function that only prefetches calls prefetch_lines.
template <int kWrite = 0, int kLocality = 2>
EMBROPE_INLINE_INTO_CALLER void ask_for_lines(const void* base, std::int64_t from,
                                              std::int64_t to) {
  constexpr std::uintptr_t kLine = 64;
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  for (std::uintptr_t a = (start + static_cast<std::uintptr_t>(from)) / kLine * kLine;
       a < start + static_cast<std::uintptr_t>(to); a += kLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(a), kWrite, kLocality);
  }
}

// ask_for_lines as a call of its own, which nothing deletes (EMBROPE_PREFETCH_ONLY).
template <int kWrite = 0, int kLocality = 2>
EMBROPE_PREFETCH_ONLY void prefetch_lines(const void* base, std::int64_t from, std::int64_t to) {
  ask_for_lines<kWrite, kLocality>(base, from, to);
}

}  // namespace embrope::cpu

#if EMBROPE_CPU_X86
namespace embrope::cpu::simd {

using detail::BFloat16;
using detail::Half;

// Asks for the cache line holding p in L2 (PREFETCHT1). A gather's rows lie at random addresses
// and span pages, where the hardware prefetchers restart: asking for the next row's lines while
// the current row is computed keeps the misses in flight that a copy would have.
EMBROPE_SIMD_INLINE void prefetch_l2(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
}

struct Avx2 {
  using V = __m256;
  static constexpr int width = 8;

  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V load(const Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V load(const BFloat16* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }

  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store(float* p, V v) {
    _mm256_storeu_ps(p, v);
  }
  // Eight 32-bit lanes holding values below 2^16, packed to eight uint16 in order.
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static __m128i pack16(__m256i x) {
    return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  }
  // F16C rounds to nearest even like float_to_half, but keeps a NaN's payload bits where
  // float_to_half gives the quiet NaN 0x7e00 with the sign: a vector holding a NaN is stored by
  // store_quieting_nans, the others by VCVTPS2PH alone (one test and branch per vector, where
  // the blend took two packs, an extract and a VPBLENDVB on every vector): float16 RoPE of
  // Llama-3-8B at 1,024 tokens (in L3) 1.71x with the kernels capped at AVX2, 1.12-1.20x on
  // AVX-512, where the blend took six instructions (2 cores;
  // benchmarks/results/cpu-2026-12-06-f16-store-nan-branch/).
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store(Half* p, V v) {
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0)) {
      store_quieting_nans(p, v);
      return;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store_quieting_nans(Half* p, V v) {
    const __m128i rounded = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i quiet =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000)),
                        _mm256_set1_epi32(0x7e00));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_blendv_epi8(rounded, pack16(quiet), nan16));
  }
  // float_to_bfloat16's rounding of a number: u + 0x7fff + ((u >> 16) & 1), the result's bits
  // the high half.
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static __m256i bfloat16_rounded(V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store(BFloat16* p, V v) {
    // float_to_bfloat16: bfloat16_rounded, or u | 0x400000 for a NaN, then >> 16.
    const __m256i quiet = _mm256_or_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x400000));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i chosen = _mm256_blendv_epi8(bfloat16_rounded(v), quiet, nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack16(_mm256_srli_epi32(chosen, 16)));
  }

  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V set1(float x) { return _mm256_set1_ps(x); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V add(V a, V b) { return _mm256_add_ps(a, b); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V div(V a, V b) { return _mm256_div_ps(a, b); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  // (x0, x1, x2, x3, ...) -> (x1, x0, x3, x2, ...): the partner of each interleaved pair.
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V swap_pairs(V x) {
    return _mm256_permute_ps(x, 0xb1);
  }
  // (x0, x1, x2, x3, ...) -> (x0, x0, x2, x2, ...) and -> (x1, -x1, x3, -x3, ...): an
  // interleaved pair's first member in both lanes, its second with the sign flipped in the
  // second lane (sinusoids' angle addition).
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V dup_first(V x) { return _mm256_moveldup_ps(x); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V second_alternating(V x) {
    const __m256 odd_sign = _mm256_castpd_ps(_mm256_set1_pd(-0.0));  // bit 31 of odd lanes
    return _mm256_xor_ps(_mm256_movehdup_ps(x), odd_sign);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V neg(V x) {
    return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
  }
  // The lanes' sum by halving, lane[m] += lane[m + h] for h = 4, 2, 1 (detail/norm_math.hpp's
  // order within one vector).
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static float halving_sum(V v) {
    return halving_sum128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static float halving_sum128(__m128 x) {
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
  }

  // Integer lanes, for decoding quantized tables (embed's dequantize_row.inc): width bytes
  // widened to int32 lanes (unsigned or signed; exactly width bytes are read), width / 2 bytes
  // as their high then low nibbles (ExecuTorch's int4 packing order), the integer operations
  // the formats' bit fields need, and lanes chosen by an equality.
  using VI = __m256i;
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI widen_u8(const std::uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI widen_i8(const std::int8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI nibble_pairs(const std::uint8_t* p) {
    std::int32_t four;
    std::memcpy(&four, p, sizeof four);
    const __m128i bytes = _mm_cvtsi32_si128(four);
    const VI twice = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
    // Shift counts 4, 0, 4, 0, ...: the 64-bit lanes' 4 seen as 32-bit lanes.
    return and_i(_mm256_srlv_epi32(twice, _mm256_set1_epi64x(4)), set1_i(0x0f));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI set1_i(std::int32_t x) {
    return _mm256_set1_epi32(x);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI and_i(VI a, VI b) {
    return _mm256_and_si256(a, b);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI or_i(VI a, VI b) {
    return _mm256_or_si256(a, b);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI add_i(VI a, VI b) {
    return _mm256_add_epi32(a, b);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI sub_i(VI a, VI b) {
    return _mm256_sub_epi32(a, b);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI shl_i(VI a, int n) {
    return _mm256_sll_epi32(a, _mm_cvtsi32_si128(n));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI shr_i(VI a, int n) {  // logical
    return _mm256_srl_epi32(a, _mm_cvtsi32_si128(n));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V to_float(VI a) { return _mm256_cvtepi32_ps(a); }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V bits_float(VI a) {
    return _mm256_castsi256_ps(a);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI float_bits(V a) {
    return _mm256_castps_si256(a);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static V select_equal(VI a, VI b, V then, V otherwise) {
    return _mm256_blendv_ps(otherwise, then, _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b)));
  }
  // For lanes below 2^31 (signed comparisons): the smaller of a and b; then where a < b,
  // otherwise elsewhere; and lanes holding 0 to 255 stored as width bytes (packed with
  // saturation here, truncated on AVX-512: the same bytes in that range). For float8.inc's
  // float8 conversion.
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI min_i(VI a, VI b) {
    return _mm256_min_epi32(a, b);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static VI select_less_i(VI a, VI b, VI then,
                                                                  VI otherwise) {
    return _mm256_blendv_epi8(otherwise, then, _mm256_cmpgt_epi32(b, a));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store_low_bytes(std::uint8_t* p, VI x) {
    const __m128i words = pack16(x);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
  }

  // No 16-bit lane permute (AVX-512's table lookups below).
  static constexpr bool has_table_lookup = false;
  // The pieces of a store of K vectors at once (store_vectors.inc's store_vectors: one test for
  // the K vectors, then two vectors per store_pair_fast; if the test fails, all K are stored
  // vector by vector). store_pair_fast(p, a, b): a at p, b after it, with store's bits wherever
  // fast_pairs_exact holds for them. float16: VCVTPS2PH alone. bfloat16: bfloat16_rounded on
  // each vector, the high halves packed by VPACKUSDW (per 128-bit lane) and put in order by
  // VPERMQ into a 32-byte store. Both exact for every value but a NaN.
  template <typename T, int K>
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static bool fast_pairs_exact(const T*, const V (&v)[K]) {
    return !any_nan(v);
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store_pair_fast(Half* p, V a, V b) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + width),
                     _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void store_pair_fast(BFloat16* p, V a, V b) {
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(bfloat16_rounded(a), 16),
                                               _mm256_srli_epi32(bfloat16_rounded(b), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  // Whether any lane of the K vectors is a NaN.
  template <int K>
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static bool any_nan(const V (&v)[K]) {
    __m256 nan = _mm256_cmp_ps(v[0], v[0], _CMP_UNORD_Q);
#pragma GCC unroll 16
    for (int k = 1; k < K; ++k) nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
    return _mm256_movemask_ps(nan) != 0;
  }

  // Streaming (non-temporal) stores, for outputs too large to stay in cache: no read for
  // ownership of the line. p aligned to the store's size (32 bytes of float32, 16 of 16-bit
  // values); the same bits as store().
  static constexpr int kStreamAlign = 32;
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void stream(float* p, V v) {
    _mm256_stream_ps(p, v);
  }
  template <typename T>
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void stream(T* p, V v) {
    alignas(16) T staged[width];
    store(staged, v);
    _mm_stream_si128(reinterpret_cast<__m128i*>(p),
                     _mm_load_si128(reinterpret_cast<__m128i*>(staged)));
  }
  // Copies `bytes` (a multiple of 32) to a 32-byte aligned dst with streaming stores.
  EMBROPE_TARGET_AVX2 EMBROPE_SIMD_INLINE static void stream_copy(void* dst, const void* src,
                                                                  std::size_t bytes) {
    auto* d = static_cast<__m256i*>(dst);
    const auto* s = static_cast<const __m256i*>(src);
    for (std::size_t i = 0; i < bytes / 32; ++i)
      _mm256_stream_si256(d + i, _mm256_loadu_si256(s + i));
  }
};

struct Avx512 {
  using V = __m512;
  static constexpr int width = 16;

  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V load(const Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V load(const BFloat16* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }

  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store(float* p, V v) {
    _mm512_storeu_ps(p, v);
  }
  // As Avx2's.
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store(Half* p, V v) {
    if (__builtin_expect(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0, 0)) {
      store_quieting_nans(p, v);
      return;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store_quieting_nans(Half* p, V v) {
    const __m256i rounded = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i quiet =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000)),
                        _mm512_set1_epi32(0x7e00));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_mask_blend_epi16(nan, rounded, _mm512_cvtepi32_epi16(quiet)));
  }
  // float_to_bfloat16's rounding of a number: u + 0x7fff + ((u >> 16) & 1), the result's bits
  // the high half.
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static __m512i bfloat16_rounded(V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store(BFloat16* p, V v) {
    const __m512i quiet = _mm512_or_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x400000));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i chosen = _mm512_mask_blend_epi32(nan, bfloat16_rounded(v), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(chosen, 16)));
  }

  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V set1(float x) { return _mm512_set1_ps(x); }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V add(V a, V b) { return _mm512_add_ps(a, b); }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V div(V a, V b) { return _mm512_div_ps(a, b); }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V swap_pairs(V x) {
    return _mm512_permute_ps(x, 0xb1);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V dup_first(V x) {
    return _mm512_moveldup_ps(x);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V second_alternating(V x) {
    const __m512 odd_sign = _mm512_castpd_ps(_mm512_set1_pd(-0.0));  // bit 31 of odd lanes
    return _mm512_xor_ps(_mm512_movehdup_ps(x), odd_sign);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V neg(V x) {
    return _mm512_xor_ps(x, _mm512_set1_ps(-0.0f));
  }
  // As Avx2's, from h = 8.
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static float halving_sum(V v) {
    // The upper half brought down by a lane shuffle (GCC 12 warns on the extract intrinsics).
    const __m512 y = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
    return Avx2::halving_sum(_mm512_castps512_ps256(y));
  }

  // As Avx2's.
  using VI = __m512i;
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI widen_u8(const std::uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI widen_i8(const std::int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI nibble_pairs(const std::uint8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const VI twice = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
    return and_i(_mm512_srlv_epi32(twice, _mm512_set1_epi64(4)), set1_i(0x0f));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI set1_i(std::int32_t x) {
    return _mm512_set1_epi32(x);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI and_i(VI a, VI b) {
    return _mm512_and_si512(a, b);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI or_i(VI a, VI b) {
    return _mm512_or_si512(a, b);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI add_i(VI a, VI b) {
    return _mm512_add_epi32(a, b);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI sub_i(VI a, VI b) {
    return _mm512_sub_epi32(a, b);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI shl_i(VI a, int n) {
    return _mm512_sll_epi32(a, _mm_cvtsi32_si128(n));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI shr_i(VI a, int n) {
    return _mm512_srl_epi32(a, _mm_cvtsi32_si128(n));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V to_float(VI a) {
    return _mm512_cvtepi32_ps(a);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V bits_float(VI a) {
    return _mm512_castsi512_ps(a);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI float_bits(V a) {
    return _mm512_castps_si512(a);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V select_equal(VI a, VI b, V then, V otherwise) {
    return _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(a, b), otherwise, then);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI min_i(VI a, VI b) {
    return _mm512_min_epi32(a, b);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI select_less_i(VI a, VI b, VI then,
                                                                    VI otherwise) {
    return _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(a, b), otherwise, then);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store_low_bytes(std::uint8_t* p, VI x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(x));
  }

  // Table lookups, for formats whose runs of values share factors and have 16 codes (int4,
  // Q4_0, Q4_K: a run's outputs are 16 values computed once): packed nibbles as 16-bit indices
  // (nibble_word_pairs: 16 bytes, each byte's high nibble then its low one, nibble_pairs'
  // order); 32 16-bit values from the first 16 of a table's (VPERMW); 16 float32 values from a
  // table's 16 lanes (VPERMPS); 64 bytes stored, or streamed to a 64-byte aligned p.
  static constexpr bool has_table_lookup = true;

  // As Avx2's (store_vectors.inc's store_vectors). float16: VCVTPS2PH alone, where store takes a
  // NaN test per vector: Llama-3-8B float16 RoPE at 1,024 tokens 1.09x, Pythia 1.03-1.06x
  // (three of three alternations, 2 cores;
  // benchmarks/results/cpu-2026-12-06-f16-store-nan-branch/). bfloat16: bfloat16_rounded on
  // each vector and the high words of both taken in order by one VPERMT2W into a 64-byte
  // store, where store takes a NaN blend, a shift and a VPMOVDW per vector.
  template <typename T, int K>
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static bool fast_pairs_exact(const T*,
                                                                         const V (&v)[K]) {
    return !any_nan(v);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store_pair_fast(Half* p, V a, V b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + width),
                        _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store_pair_fast(BFloat16* p, V a, V b) {
    // Word j of the result: word 2j + 1 of (a, b), the high half of float j.
    const __m512i high_words =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    _mm512_storeu_si512(
        p, _mm512_permutex2var_epi16(bfloat16_rounded(a), high_words, bfloat16_rounded(b)));
  }
  // Whether any lane of the K vectors is a NaN.
  template <int K>
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static bool any_nan(const V (&v)[K]) {
    __mmask16 nan = 0;
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k) nan |= _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
    return nan != 0;
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI nibble_word_pairs(const std::uint8_t* p) {
    const VI bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return or_i(_mm512_srli_epi32(bytes, 4), _mm512_slli_epi32(and_i(bytes, set1_i(0x0f)), 16));
  }
  // 16 bytes as 32 16-bit indices: the low nibbles, then the high ones (GGUF's Q4_0 block).
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI nibble_word_halves(const std::uint8_t* p) {
    const __m256i bytes =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_and_si256(bytes, _mm256_set1_epi16(0x0f))),
        _mm256_srli_epi16(bytes, 4), 1);
  }
  // 32 bytes' low (or high) nibbles as 32 16-bit indices (a Q4_K sub-block).
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI nibble_words(const std::uint8_t* p,
                                                                   bool high) {
    const VI bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return high ? _mm512_srli_epi16(bytes, 4) : and_i(bytes, _mm512_set1_epi16(0x0f));
  }
  // 32 16-bit indices' first (last) 16 as 32-bit lanes, for lookup_floats.
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI low_words(VI index) {
    return _mm512_cvtepu16_epi32(_mm512_castsi512_si256(index));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI high_words(VI index) {
    return _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(index, 1));
  }
  // 32 bytes as 32 16-bit indices (float8 codes).
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI byte_words(const std::uint8_t* p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 32 16-bit values from a 128-entry 16-bit table (t[0..3], 32 entries each) at index bits
  // 0-6, the sign bit flipped where index bit 7 is set (a float8 code's sign: its value, times
  // any factor and rounded, is the same magnitude with the sign flipped).
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI lookup_signed_words(VI index, const VI* t) {
    const VI low = _mm512_permutex2var_epi16(t[0], index, t[1]);
    const VI high = _mm512_permutex2var_epi16(t[2], index, t[3]);
    const VI magnitude =
        _mm512_mask_blend_epi16(_mm512_test_epi16_mask(index, _mm512_set1_epi16(0x40)), low, high);
    return _mm512_xor_si512(magnitude, _mm512_slli_epi16(and_i(index, _mm512_set1_epi16(0x80)), 8));
  }
  // 32 16-bit table entries as store() wrote them, 16 at a time (load_table16's reason).
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI load_table32(const void* p) {
    const auto* halves = static_cast<const __m256i*>(p);
    return _mm512_inserti64x4(load_table16(halves), _mm256_loadu_si256(halves + 1), 1);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI lookup_words(VI index, VI table) {
    return _mm512_permutexvar_epi16(index, table);
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static V lookup_floats(VI index, V table) {
    return _mm512_permutexvar_ps(index, table);
  }
  // A 16-bit table of 16 entries as store() wrote it (32 bytes: loading just what the store
  // wrote lets the load take the store's bytes without waiting for it to reach the cache).
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static VI load_table16(const void* p) {
    return _mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void store_bits(void* p, VI x, bool stream) {
    if (stream) {
      _mm512_stream_si512(static_cast<__m512i*>(p), x);
    } else {
      _mm512_storeu_si512(p, x);
    }
  }

  // As Avx2's: 64 bytes of float32, 32 of 16-bit values.
  static constexpr int kStreamAlign = 64;
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void stream(float* p, V v) {
    _mm512_stream_ps(p, v);
  }
  template <typename T>
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void stream(T* p, V v) {
    alignas(32) T staged[width];
    store(staged, v);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_load_si256(reinterpret_cast<__m256i*>(staged)));
  }
  EMBROPE_TARGET_AVX512 EMBROPE_SIMD_INLINE static void stream_copy(void* dst, const void* src,
                                                                    std::size_t bytes) {
    auto* d = static_cast<__m512i*>(dst);
    const auto* s = static_cast<const __m512i*>(src);
    for (std::size_t i = 0; i < bytes / 64; ++i)
      _mm512_stream_si512(d + i, _mm512_loadu_si512(s + i));
  }
};

// AVX-512 with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later): float32 to
// bfloat16 by VCVTNEPS2BF16, one instruction for what Avx512 does in eight. It rounds to
// nearest even and quiets a NaN as (u | 0x400000) >> 16, as float_to_bfloat16 does, but it
// takes a float32 subnormal as zero; a vector holding one takes Avx512's integer rounding.
struct Avx512Bf16 : Avx512 {
  using Avx512::fast_pairs_exact;
  using Avx512::store;
  using Avx512::store_pair_fast;
  using Avx512::stream;

  EMBROPE_TARGET_AVX512_BF16 EMBROPE_SIMD_INLINE static void store(BFloat16* p, V v) {
    if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) != 0, 0)) {  // 0x20: subnormal
      Avx512::store(p, v);
      return;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits(_mm512_cvtneps_pbh(v)));
  }
  // As Avx2's (store_vectors.inc's store_vectors): one test for subnormals across the K
  // vectors (one branch for them, where store takes one per vector), then two vectors per
  // VCVTNE2PS2BF16 and a 64-byte store.
  template <int K>
  EMBROPE_TARGET_AVX512_BF16 EMBROPE_SIMD_INLINE static bool fast_pairs_exact(const BFloat16*,
                                                                              const V (&v)[K]) {
    __mmask16 subnormal = 0;
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k) subnormal |= _mm512_fpclass_ps_mask(v[k], 0x20);
    return subnormal == 0;
  }
  EMBROPE_TARGET_AVX512_BF16 EMBROPE_SIMD_INLINE static void store_pair_fast(BFloat16* p, V a,
                                                                             V b) {
    _mm512_storeu_si512(p, bits512(_mm512_cvtne2ps_pbh(b, a)));  // lower half a, upper half b
  }
  EMBROPE_TARGET_AVX512_BF16 EMBROPE_SIMD_INLINE static void stream(BFloat16* p, V v) {
    alignas(32) BFloat16 staged[width];
    store(staged, v);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_load_si256(reinterpret_cast<__m256i*>(staged)));
  }

 private:
  // The bfloat16 vector's bits (its element type differs between compilers and versions).
  template <typename Bf16Vector>
  EMBROPE_TARGET_AVX512_BF16 EMBROPE_SIMD_INLINE static __m256i bits(Bf16Vector x) {
    static_assert(sizeof(Bf16Vector) == sizeof(__m256i));
    return (__m256i)x;
  }
  template <typename Bf16Vector>
  EMBROPE_TARGET_AVX512_BF16 EMBROPE_SIMD_INLINE static __m512i bits512(Bf16Vector x) {
    static_assert(sizeof(Bf16Vector) == sizeof(__m512i));
    return (__m512i)x;
  }
};

}  // namespace embrope::cpu::simd
#endif

namespace embrope::cpu {

// An output of at least this many bytes is written with streaming stores where a vector body
// can (embed; qk-norm + RoPE out of place): it will not stay in cache, and a streaming store
// writes its line without first reading it for ownership, so a pass moves the bytes it must,
// as memcpy does past a similar size.
inline constexpr std::int64_t kStreamingOutputBytes = std::int64_t{1} << 24;

// Whether an instruction set's I::stream may write a vector of T at p: aligned to the vector's
// size (I::kStreamAlign bytes of float32, half of that of 16-bit values), as a streaming store
// requires.
template <typename I, typename T>
inline bool stream_aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (I::kStreamAlign * sizeof(T) / sizeof(float)) == 0;
}

// Streaming stores are weakly ordered: each thread that made them fences them before the team
// joins and the caller reads the output.
inline void fence_streaming_stores() {
#if EMBROPE_CPU_X86
  _mm_sfence();
#endif
}

}  // namespace embrope::cpu
