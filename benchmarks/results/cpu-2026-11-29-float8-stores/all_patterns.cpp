// Every float32 bit pattern through apply_rope's float8 outputs (pass-through elements,
// value * 1) against detail::float_to_float8, on the ISA named in EMBROPE_CPU_ISA.
#include <embrope/embrope.hpp>
#include "embrope/detail/numeric_types.hpp"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
int main() {
  using embrope::DType;
  using embrope::Tensor;
  const std::int64_t tokens = 65536, dim = 258, per = 256;  // 2^24 values per call
  std::vector<float> q(tokens * dim, 0.0f);
  std::vector<std::uint8_t> out(q.size());
  std::vector<std::int64_t> pos(tokens, 0);
  float c[1] = {1.0f}, s[1] = {0.0f};
  long bad4 = 0, bad5 = 0;
  for (std::uint64_t base = 0; base < (1ull << 32); base += (1ull << 24)) {
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t j = 0; j < per; ++j) {
        std::uint32_t b = std::uint32_t(base + t * per + j);
        std::memcpy(&q[t * dim + 2 + j], &b, 4);
      }
    for (int f = 0; f < 2; ++f) {
      embrope::RopeOptions o;
      const DType od = f == 0 ? DType::float8_e4m3fn : DType::float8_e5m2;
      o.q_out = Tensor(out.data(), od, {tokens, 1, dim});
      embrope::apply_rope(Tensor(q.data(), DType::float32, {tokens, 1, dim}), std::nullopt,
                          Tensor(pos.data(), DType::int64, {tokens}),
                          Tensor(c, DType::float32, {1, 1}), Tensor(s, DType::float32, {1, 1}), o);
      for (std::int64_t t = 0; t < tokens; ++t)
        for (std::int64_t j = 0; j < per; ++j) {
          const float x = q[t * dim + 2 + j] * 1.0f;
          const std::uint8_t want = f == 0 ? embrope::detail::float_to_float8_e4m3(x)
                                           : embrope::detail::float_to_float8_e5m2(x);
          if (out[t * dim + 2 + j] != want) (f == 0 ? bad4 : bad5)++;
        }
    }
  }
  std::printf("%s: mismatches over all 2^32 float32 patterns: e4m3 %ld, e5m2 %ld\n",
              getenv("EMBROPE_CPU_ISA"), bad4, bad5);
}
