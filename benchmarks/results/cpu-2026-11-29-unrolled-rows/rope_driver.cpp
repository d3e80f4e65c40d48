#include <embrope/embrope.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstdint>
int main(int argc, char** argv) {
  const std::int64_t T = atol(argv[1]), H = atol(argv[2]), D = atol(argv[3]), R = atol(argv[4]);
  const int iters = atoi(argv[5]);
  const bool interleaved = argc > 6;
  const std::size_t n = static_cast<std::size_t>(T * H * D);
  auto* q = static_cast<std::uint16_t*>(std::aligned_alloc(64, n * 2));
  auto* k = static_cast<std::uint16_t*>(std::aligned_alloc(64, n * 2));
  for (std::size_t i = 0; i < n; ++i) q[i] = k[i] = 0x3f80;
  std::vector<std::int64_t> pos(T);
  for (std::int64_t t = 0; t < T; ++t) pos[t] = t;
  std::vector<float> cs(T * R / 2), sn(T * R / 2);
  for (std::int64_t i = 0; i < T * R / 2; ++i) {
    cs[i] = 0.6f;
    sn[i] = 0.8f;
  }
  using embrope::DType;
  using embrope::Tensor;
  embrope::RopeOptions o;
  o.layout = interleaved ? embrope::RopeLayout::interleaved : embrope::RopeLayout::neox;
  Tensor qt(q, DType::bfloat16, {T, H, D}), kt(k, DType::bfloat16, {T, H, D});
  Tensor p(pos.data(), DType::int64, {T});
  Tensor c(cs.data(), DType::float32, {T, R / 2}), s(sn.data(), DType::float32, {T, R / 2});
  for (int i = 0; i < 3; ++i) embrope::apply_rope(qt, kt, p, c, s, o);
  std::vector<double> ts;
  for (int i = 0; i < iters; ++i) {
    auto a = std::chrono::steady_clock::now();
    embrope::apply_rope(qt, kt, p, c, s, o);
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(ts.begin(), ts.end());
  std::printf("median %.1f us\n", ts[ts.size() / 2] * 1e6);
}
