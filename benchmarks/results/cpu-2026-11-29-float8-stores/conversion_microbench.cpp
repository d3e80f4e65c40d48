#include "embrope/detail/numeric_types.hpp"
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <random>
using namespace embrope::detail;
__attribute__((noinline, target("avx512f,avx512bw,avx512vl,avx512dq"))) void conv_simd(
    const float* in, std::uint8_t* out, long n, float scale) {
#pragma omp simd
  for (long j = 0; j < n; ++j) out[j] = from_float<Float8E4M3>(in[j] * scale).bits;
}
// Hand-written: the same steps as float_to_float8(x, 3, 7, 0x7e, 0x7f), 16 lanes.
template <int M, int B>
__attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq"))) inline __m128i f8_16(
    __m512 x, std::uint32_t max_code, std::uint32_t nan_code) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  constexpr int drop = 23 - M;
  const __m512 scaled = _mm512_mul_ps(
      _mm512_castsi512_ps(a), _mm512_castsi512_ps(_mm512_set1_epi32((127 + B - 1 + M) << 23)));
  const __m512i sub =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(scaled, _mm512_set1_ps(8388608.0f))),
                       _mm512_set1_epi32(0x4b000000));
  const __m512i reb = _mm512_sub_epi32(a, _mm512_set1_epi32((127 - B) << 23));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(reb, drop), _mm512_set1_epi32(1));
  const __m512i normal = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(reb, _mm512_set1_epi32((1u << (drop - 1)) - 1)), lsb),
      drop);
  const __mmask16 is_sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32((127 - B + 1) << 23));
  __m512i code = _mm512_mask_blend_epi32(is_sub, normal, sub);
  code = _mm512_min_epu32(code, _mm512_set1_epi32(max_code));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
  code = _mm512_mask_blend_epi32(is_nan, code, _mm512_set1_epi32(nan_code));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}
__attribute__((noinline, target("avx512f,avx512bw,avx512vl,avx512dq"))) void conv_hand(
    const float* in, std::uint8_t* out, long n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  long j = 0;
  for (; j + 16 <= n; j += 16)
    _mm_storeu_si128((__m128i*)(out + j),
                     f8_16<3, 7>(_mm512_mul_ps(_mm512_loadu_ps(in + j), s), 0x7e, 0x7f));
  for (; j < n; ++j) out[j] = from_float<Float8E4M3>(in[j] * scale).bits;
}
int main() {
  const long n = 1 << 14;
  std::vector<float> in(n);
  std::vector<std::uint8_t> o1(n), o2(n);
  std::mt19937 g(1);
  for (auto& v : in) {
    std::uint32_t b = g();
    v = bits_float(b);
  }
  // exhaustive-ish check over all float bit patterns (step 7)
  long bad = 0;
  std::vector<float> chunk(1 << 16);
  std::vector<std::uint8_t> c1(1 << 16), c2(1 << 16);
  for (std::uint64_t base = 0; base < (1ull << 32); base += (1 << 16)) {
    for (int i = 0; i < (1 << 16); ++i) chunk[i] = bits_float(std::uint32_t(base + i));
    for (int i = 0; i < (1 << 16); ++i) c1[i] = float_to_float8_e4m3(chunk[i]);
    conv_hand(chunk.data(), c2.data(), 1 << 16, 1.0f);
    for (int i = 0; i < (1 << 16); ++i) bad += c1[i] != c2[i];
  }
  printf("mismatches over all 2^32 floats: %ld\n", bad);
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) conv_simd(in.data(), o1.data(), n, 0.5f);
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) conv_hand(in.data(), o2.data(), n, 0.5f);
    auto t2 = std::chrono::steady_clock::now();
    printf("simd %.3f ns/elem  hand %.3f ns/elem  same=%d\n",
           std::chrono::duration<double>(t1 - t0).count() / 2000 / n * 1e9,
           std::chrono::duration<double>(t2 - t1).count() / 2000 / n * 1e9, (int)(o1 == o2));
  }
}
