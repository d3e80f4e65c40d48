// Streaming stores and arithmetic, one after the other or interleaved, per 8 KiB row.
// usage: stream_store_overlap MODE ROWS. MODE 0: 64-byte streaming stores only; 1: arithmetic
// only; 2: the stores, then the arithmetic; 3: a store, then 1/128 of the arithmetic; 4:
// 32-byte streaming stores only. Build: g++ -O2 -fopenmp.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <omp.h>
__attribute__((target("avx512f"))) int main(int argc, char** argv) {
  const int mode = atoi(argv[1]);
  const long rows = atol(argv[2]);
  const long row_bytes = 8192;
  char* out = (char*)aligned_alloc(64, rows * row_bytes);
  memset(out, 1, rows * row_bytes);
  double best = 1e30;
  float sink = 0;
  for (int rep = 0; rep < 7; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    {
      alignas(64) static thread_local float a[4096 * 3];
      for (int i = 0; i < 4096 * 3; ++i) a[i] = i * 1e-3f;
      __m512 acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = _mm512_setzero_ps();
      const __m512 v = _mm512_set1_ps(1.5f);
#pragma omp for schedule(static)
      for (long r = 0; r < rows; ++r) {
        char* o = out + r * row_bytes;
        if (mode == 0 || mode == 2) {
          for (int l = 0; l < 128; ++l) _mm512_stream_ps((float*)(o + 64 * l), v);
        }
        if (mode == 1 || mode == 2) {
          for (int j = 0; j < 4096 * 3; j += 128)
            for (int k = 0; k < 8; ++k)
              acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(_mm512_load_ps(a + j + 16 * k), v));
        }
        if (mode == 4) {
          for (int l = 0; l < 256; ++l)
            _mm256_stream_ps((float*)(o + 32 * l), _mm512_castps512_ps256(v));
        }
        if (mode == 3) {
          for (int l = 0; l < 128; ++l) {
            _mm512_stream_ps((float*)(o + 64 * l), v);
            const int j = l * 96;
            for (int k = 0; k < 6; ++k)
              acc[(l * 6 + k) & 7] =
                  _mm512_add_ps(acc[k], _mm512_mul_ps(_mm512_load_ps(a + j + 16 * k), v));
          }
        }
      }
      for (int k = 0; k < 8; ++k) sink += _mm512_reduce_add_ps(acc[k]);
    }
    _mm_sfence();
    double t =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (t < best) best = t;
  }
  printf("mode %d: %.1f us  %.3f us/row/core  (%g)\n", mode, best,
         best / rows * omp_get_max_threads(), sink);
}
