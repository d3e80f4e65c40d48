// RoPE of q and k into float8 e4m3 (q_out, k_out), timed per call.
// usage: rope_float8_calls dtype(bf16|f16|f32) tokens hq hk head_dim rotary_dim
//        layout(neox|interleaved) calls
#include <embrope/embrope.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>
int main(int argc, char** argv) {
  using namespace embrope;
  const std::string dt = argv[1];
  const long T = atol(argv[2]), hq = atol(argv[3]), hk = atol(argv[4]), D = atol(argv[5]),
             R = atol(argv[6]);
  const bool neox = std::string(argv[7]) == "neox";
  const int calls = atoi(argv[8]);
  DType dtype = dt == "bf16" ? DType::bfloat16 : dt == "f16" ? DType::float16 : DType::float32;
  const int es = dtype_size(dtype);
  std::vector<unsigned char> q(T * hq * D * es), k(T * hk * D * es);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  auto fill = [&](std::vector<unsigned char>& b) {
    for (size_t i = 0; i < b.size() / es; ++i) {
      float f = u(rng);
      if (es == 4)
        memcpy(&b[i * 4], &f, 4);
      else if (dt == "bf16") {
        unsigned x;
        memcpy(&x, &f, 4);
        unsigned short h = x >> 16;
        memcpy(&b[i * 2], &h, 2);
      } else {
        _Float16 h = (_Float16)f;
        memcpy(&b[i * 2], &h, 2);
      }
    }
  };
  fill(q);
  fill(k);
  std::vector<long> pos(T);
  for (long t = 0; t < T; ++t) pos[t] = t;
  RopeCache cache(RopeConfig{R, 500000.0, 65536}, Device{});
  Tensor tq(q.data(), dtype, {T, hq, D}, Device{}), tk(k.data(), dtype, {T, hk, D}, Device{});
  Tensor tp(pos.data(), DType::int64, {T}, Device{});
  RopeOptions o;
  o.layout = neox ? RopeLayout::neox : RopeLayout::interleaved;
  std::vector<unsigned char> q8(T * hq * D), k8(T * hk * D);
  o.q_out = Tensor(q8.data(), DType::float8_e4m3fn, {T, hq, D}, Device{});
  o.k_out = Tensor(k8.data(), DType::float8_e4m3fn, {T, hk, D}, Device{});
  o.q_out_scale = 0.5f;
  o.k_out_scale = 2.0f;
  std::vector<double> ts;
  for (int c = 0; c < calls; ++c) {
    auto t0 = std::chrono::steady_clock::now();
    apply_rope(tq, tk, tp, cache, o);
    ts.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  printf("min %.1f p10 %.1f med %.1f us\n", ts[0], ts[ts.size() / 10], ts[ts.size() / 2]);
}
