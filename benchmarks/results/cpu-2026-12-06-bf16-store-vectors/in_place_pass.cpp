// The in-place pass of benchmarks/bench.cpp's ceiling_body (each 8-byte word's float sign bits
// flipped, split over the cores), standalone: 15 passes over each of four 168 MiB buffers,
// in turn. Built and run as: g++ -O3 -march=native -fopenmp in_place_pass.cpp && ./a.out
// (in_place_pass.txt: two runs).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
static void pass(std::uint64_t* w, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) w[i] ^= 0x8000000080000000ull;
}
int main() {
  const size_t bytes = 168ull << 20, n = bytes / 8;
  std::vector<std::uint64_t*> bufs;
  for (int b = 0; b < 4; ++b) {
    auto* p = (std::uint64_t*)aligned_alloc(64, bytes);
    for (size_t i = 0; i < n; ++i) p[i] = i * 0x9e3779b97f4a7c15ull;
    bufs.push_back(p);
  }
  std::vector<std::vector<double>> t(4);
  for (int r = 0; r < 15; ++r)
    for (int b = 0; b < 4; ++b) {
      auto s = std::chrono::steady_clock::now();
      pass(bufs[b], n);
      t[b].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
    }
  for (int b = 0; b < 4; ++b) {
    auto v = t[b];
    std::sort(v.begin(), v.end());
    printf("buf %d: min %.2f med %.2f max %.2f ms\n", b, v[0], v[v.size() / 2], v.back());
  }
}
