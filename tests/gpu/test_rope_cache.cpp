// RopeCache on the GPU against the CPU: plain caches and every scaling variant, within one
// float32 ulp.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_support.hpp"

using namespace gpu_test;

namespace {

// cos and sin tables, GPU against CPU: within one float32 ulp of the CPU's magnitude (the
// device's float64 cos and sin may differ from the host's in the last float64 bits, which can
// move the float32 rounding by one ulp).
void compare_tables(const std::vector<float>& cpu_cos, const std::vector<float>& cpu_sin,
                    const std::vector<float>& gpu_cos, const std::vector<float>& gpu_sin) {
  Mismatches mm;
  auto one_ulp = [](float c, float g) {
    const float m = std::fabs(c);
    return std::fabs(c - g) <= std::nextafter(m, INFINITY) - m;
  };
  for (std::size_t i = 0; i < cpu_cos.size(); ++i) {
    const auto e = static_cast<std::int64_t>(i);
    mm.check(one_ulp(cpu_cos[i], gpu_cos[i]), [&] { return where(e, 0, gpu_cos[i], cpu_cos[i]); });
    mm.check(one_ulp(cpu_sin[i], gpu_sin[i]), [&] { return where(e, 1, gpu_sin[i], cpu_sin[i]); });
  }
  mm.require();
}

}  // namespace

TEST_CASE("GPU cache equals CPU cache within one float32 ulp", "[gpu][rope_cache]") {
  for (std::int64_t r : {2, 64, 128, 256}) {
    const embrope::RopeConfig config{r, 500000.0, 70000};
    embrope::RopeCache cpu(config);
    embrope::RopeCache gpu(config, Device::cuda(0));
    const std::size_t n = static_cast<std::size_t>(config.max_positions * r / 2);
    std::vector<float> cc(n), cs(n), gc(n), gs(n);
    cpu.copy_to_host(cc.data(), cs.data());
    gpu.copy_to_host(gc.data(), gs.data());
    std::size_t differ = 0;
    compare_tables(cc, cs, gc, gs);
    for (std::size_t i = 0; i < n; ++i) differ += (cc[i] != gc[i]) + (cs[i] != gs[i]);
    WARN("rotary_dim " << r << ": " << differ << " of " << 2 * n << " values differ by one ulp");
  }
}

TEST_CASE("GPU caches of every scaling variant equal the CPU caches within one float32 ulp",
          "[gpu][rope_cache][scaling]") {
  for (const auto& [name, config] : scaled_configs()) {
    INFO(name);
    embrope::RopeCache cpu(config);
    embrope::RopeCache gpu(config, Device::cuda(0));
    REQUIRE(gpu.attention_factor() == cpu.attention_factor());
    const std::size_t n = static_cast<std::size_t>(config.max_positions * config.rotary_dim / 2);
    std::vector<float> cc(n), cs(n), gc(n), gs(n);
    cpu.copy_to_host(cc.data(), cs.data());
    gpu.copy_to_host(gc.data(), gs.data());
    compare_tables(cc, cs, gc, gs);
  }
}
