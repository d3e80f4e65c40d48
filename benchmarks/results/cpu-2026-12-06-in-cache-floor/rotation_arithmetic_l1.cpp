// The rotation's arithmetic alone (neox: out1 = a c - b s, out2 = a s + b c, separate
// multiplies and adds, float32 AVX-512) over rows held in L1: one head row of 128 float32
// rotated out of place into another, 10^6 times, no chain between iterations. The per-vector
// floor of the loads, multiplies, adds and stores, without conversions. Built and run as:
// g++ -O2 -mavx512f -ffp-contract=off rotation_arithmetic_l1.cpp && ./a.out
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <vector>
int main() {
  alignas(64) static float x[128], y[128], c[64], s[64];
  for (int i = 0; i < 128; ++i) x[i] = 0.001f * i;
  for (int i = 0; i < 64; ++i) {
    c[i] = 0.6f;
    s[i] = 0.8f;
  }
  std::vector<double> t;
  for (int r = 0; r < 50; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < 1000000; ++it) {
      for (int v = 0; v < 64; v += 16) {
        __m512 a = _mm512_load_ps(x + v), b = _mm512_load_ps(x + 64 + v);
        __m512 cv = _mm512_load_ps(c + v), sv = _mm512_load_ps(s + v);
        _mm512_store_ps(y + v, _mm512_sub_ps(_mm512_mul_ps(a, cv), _mm512_mul_ps(b, sv)));
        _mm512_store_ps(y + 64 + v, _mm512_add_ps(_mm512_mul_ps(a, sv), _mm512_mul_ps(b, cv)));
      }
      __asm__ volatile("" ::: "memory");
    }
    t.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
        (1e6 * 8));
  }
  std::sort(t.begin(), t.end());
  printf("rotation arithmetic in L1, 1 thread: min %.3f med %.3f ns per 16-element output vector\n",
         t[0], t[t.size() / 2]);
}
