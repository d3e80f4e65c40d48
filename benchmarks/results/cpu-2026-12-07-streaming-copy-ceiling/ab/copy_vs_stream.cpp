// The standalone test of README.md: memcpy, a streaming copy and a streaming gather of random
// 8 KiB rows (no prefetching), two OpenMP threads, 5 rounds.  g++ -O2 -fopenmp; ./a.out MIB
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <random>
using clk = std::chrono::steady_clock;
__attribute__((target("avx512f"))) void nt_copy(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64)
    _mm512_stream_si512((__m512i*)(d + i), _mm512_load_si512((const __m512i*)(s + i)));
}
__attribute__((target("avx512f"))) void nt_gather(char* d, const char* table, const int64_t* ids,
                                                  size_t rows, size_t row_bytes) {
  for (size_t r = 0; r < rows; ++r) {
    const char* s = table + ids[r] * row_bytes;
    char* o = d + r * row_bytes;
    for (size_t i = 0; i < row_bytes; i += 64)
      _mm512_stream_si512((__m512i*)(o + i), _mm512_load_si512((const __m512i*)(s + i)));
  }
}
int main(int argc, char** argv) {
  size_t half = (size_t)atol(argv[1]) << 20;
  char* s = (char*)aligned_alloc(64, half);
  char* d = (char*)aligned_alloc(64, half);
  memset(s, 1, half);
  memset(d, 2, half);
  size_t row = 8192, vocab = 32000;
  char* table = (char*)aligned_alloc(64, vocab * row);
  memset(table, 3, vocab * row);
  size_t rows = half / row;
  std::vector<int64_t> ids(rows);
  std::mt19937_64 g(1);
  for (auto& x : ids) x = g() % vocab;
  for (int rep = 0; rep < 5; ++rep) {
    double t[3];
    for (int k = 0; k < 3; ++k) {
      auto a = clk::now();
#pragma omp parallel
      {
        size_t T = omp_get_num_threads(), i = omp_get_thread_num();
        size_t c = (half / T) & ~size_t(63);
        size_t b = c * i;
        size_t e = i == T - 1 ? half : b + c;
        if (k == 0)
          memcpy(d + b, s + b, e - b);
        else if (k == 1)
          nt_copy(d + b, s + b, e - b);
        else {
          size_t rb = rows * i / T, re = rows * (i + 1) / T;
          nt_gather(d + rb * row, table, ids.data() + rb, re - rb, row);
          (void)re;
        }
      }
      t[k] = std::chrono::duration<double>(clk::now() - a).count();
    }
    printf("%zu MiB: memcpy %.1f GB/s, nt copy %.1f GB/s, nt gather %.1f GB/s\n", half >> 20,
           2 * half / t[0] / 1e9, 2 * half / t[1] / 1e9, 2 * half / t[2] / 1e9);
  }
}
