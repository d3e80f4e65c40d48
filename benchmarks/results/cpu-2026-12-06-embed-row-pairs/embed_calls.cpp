// usage: embed_calls dtype(bf16|f16|f32) tokens vocab cached(0|1) norm(0|1) calls [sinusoidal]
// Learned positions, or sinusoidal ones with a last argument "sinusoidal". The last column
// printed is the median over tokens, times two: per row and core on two threads.
// Built against the installed library: c++ -O2 -mf16c -std=c++17 embed_calls.cpp -lembrope
#include <embrope/embrope.hpp>
#include <immintrin.h>
#include <chrono>
#include <cstdlib>
#include <string>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>
int main(int argc, char** argv) {
  using namespace embrope;
  const std::string dt = argv[1];
  const long T = atol(argv[2]), V = atol(argv[3]);
  const bool cached = atoi(argv[4]), norm = atoi(argv[5]);
  const int calls = atoi(argv[6]);
  const long D = 4096, P = 32768;
  DType dtype = dt == "bf16" ? DType::bfloat16 : dt == "f16" ? DType::float16 : DType::float32;
  const int es = dtype_size(dtype);
  std::vector<unsigned char> table(V * D * es), ptable(P * D * es), out(T * D * es);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  auto fill = [&](std::vector<unsigned char>& b) {
    for (size_t i = 0; i < b.size() / es; ++i) {
      float f = u(rng);
      if (es == 4)
        memcpy(&b[i * 4], &f, 4);
      else if (dt == "f16") {
        unsigned short h = _cvtss_sh(f, 0);
        memcpy(&b[i * 2], &h, 2);
      } else {
        unsigned x;
        memcpy(&x, &f, 4);
        unsigned short h = x >> 16;
        memcpy(&b[i * 2], &h, 2);
      }
    }
  };
  fill(table);
  fill(ptable);
  std::vector<float> w(D), bia(D);
  for (long j = 0; j < D; ++j) {
    w[j] = u(rng);
    bia[j] = u(rng);
  }
  std::vector<long> ids(T), pos(T);
  std::uniform_int_distribution<long> vi(0, V - 1);
  for (long t = 0; t < T; ++t) {
    ids[t] = cached ? t % 4 : vi(rng);
    pos[t] = cached ? t % 4 : t;
  }
  Tensor tt(table.data(), dtype, {V, D}, Device{}), ti(ids.data(), DType::int64, {T}, Device{});
  Tensor to(out.data(), dtype, {T, D}, Device{});
  EmbedOptions o;
  o.positions = PositionEncoding::learned;
  o.position_table = Tensor(ptable.data(), dtype, {P, D}, Device{});
  o.position_ids = Tensor(pos.data(), DType::int64, {T}, Device{});
  if (argc > 7 && std::string(argv[7]) == "sinusoidal") {
    o.positions = PositionEncoding::sinusoidal;
    o.position_table.reset();
  }
  if (norm) {
    o.norm = Normalization::layer_norm;
    o.norm_eps = 1e-12f;
    o.norm_weight = Tensor(w.data(), DType::float32, {D}, Device{});
    o.norm_bias = Tensor(bia.data(), DType::float32, {D}, Device{});
  }
  std::vector<double> ts;
  for (int c = 0; c < calls; ++c) {
    auto t0 = std::chrono::steady_clock::now();
    embed(tt, ti, to, o);
    ts.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  printf("min %.1f p10 %.1f med %.1f us  (%.3f us/row/core at median)\n", ts[0], ts[ts.size() / 10],
         ts[ts.size() / 2], ts[ts.size() / 2] / T * 2);
}
