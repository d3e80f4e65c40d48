// mla_calls: DeepSeek-V3's MLA rotation at decode sizes, timed call by call: the fused
// apply_rope_append_kv (q_pe and k_pe rotated in place, k_pe and kv_c written to a paged latent
// cache of 576-element rows, as benchmarks/bench.cpp's mla_rope_append_kv case), then
// apply_rope of the same slices alone. Prints the fastest and the median call of each.
// usage: mla_calls tokens calls
#include <embrope/embrope.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace embrope;

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const long T = atol(argv[1]);
  const int calls = atoi(argv[2]);
  const long h = 128, nope = 128, rope = 64, rank = 512, page = 16;
  const long qd = nope + rope, kd = rank + rope, pages = (T + page - 1) / page;
  std::vector<unsigned short> q(T * h * qd, 0x3f80), kv(T * kd, 0x3f00), cache(pages * page * kd);
  std::vector<long> pos(T), slots(T);
  for (long t = 0; t < T; ++t) {
    pos[t] = 100 + t;
    slots[t] = t;
  }
  RopeCache rc(RopeConfig{rope, 10000.0, 4096}, Device{});
  auto view = [](void* p, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides) {
    return Tensor(p, DType::bfloat16, (int)shape.size(), shape.data(), strides.data(), Device{});
  };
  const Tensor q_pe = view(q.data() + nope, {T, h, rope}, {h * qd, qd, 1});
  const Tensor k_pe = view(kv.data() + rank, {T, 1, rope}, {kd, rope, 1});
  const Tensor kv_c = view(kv.data(), {T, 1, rank}, {kd, rank, 1});
  const Tensor tp(pos.data(), DType::int64, {T}, Device{});
  KvCache kc;
  kc.k = view(cache.data() + rank, {pages, page, 1, rope}, {page * kd, kd, rope, 1});
  kc.v = view(cache.data(), {pages, page, 1, rank}, {page * kd, kd, rank, 1});
  const KvSlots ks = KvSlots::paged(Tensor(slots.data(), DType::int64, {T}, Device{}));
  RopeOptions o;
  o.layout = RopeLayout::interleaved;
  for (int fused = 1; fused >= 0; --fused) {
    std::vector<double> ts;
    for (int c = 0; c < calls; ++c) {
      const auto t0 = std::chrono::steady_clock::now();
      if (fused) {
        apply_rope_append_kv(q_pe, k_pe, kv_c, tp, rc, kc, ks, o);
      } else {
        apply_rope(q_pe, k_pe, tp, rc, o);
      }
      ts.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      o.inverse = !o.inverse;  // keeps the values bounded
    }
    std::sort(ts.begin(), ts.end());
    printf("%s min %.3f med %.3f us\n", fused ? "apply_rope_append_kv" : "apply_rope          ",
           ts[0], ts[ts.size() / 2]);
  }
}
