// Cases that span ops on the GPU: apply_rope and embed with no tokens, and a bad id or position
// at the int32/int64 limits followed by a call of the other op on the same context.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_support.hpp"

using namespace gpu_test;

TEST_CASE("GPU ops with no tokens are no-ops", "[gpu]") {
  Buffer q(4), pos(8), table(64 * 4), out(4);
  embrope::RopeCache cache({8, 10000.0, 16}, Device::cuda(0));
  const Device g = Device::cuda(0);
  CHECK_NOTHROW(embrope::apply_rope(Tensor(q.device, DType::float32, {0, 2, 8}, g), std::nullopt,
                                    Tensor(pos.device, DType::int64, {0}, g), cache));
  CHECK_NOTHROW(embrope::embed(Tensor(table.device, DType::float32, {8, 8}, g),
                               Tensor(pos.device, DType::int64, {0}, g),
                               Tensor(out.device, DType::float32, {0, 8}, g)));
}

TEST_CASE("GPU ids and positions at the int32/int64 limits, then the other op on the context",
          "[gpu][errors]") {
  // Each extreme value alone in an otherwise good call: the call fails naming it, its row
  // is zero, nothing outside the tensors is touched (compute-sanitizer memcheck in
  // scripts/gpu-check.sh), and the next call of the other op on the same context is exact.
  const std::int64_t vocab = 64, dim = 64, rows = 256, heads = 2, max_pos = 128;
  const Device gpu = Device::cuda(0);
  Buffer table(vocab * dim * 4), ids(rows * 8), ids32(rows * 4), out(rows * dim * 4);
  Buffer q(rows * heads * dim * 4), pos(rows * 8);
  fill_random(table, DType::float32, vocab * dim, 21);
  fill_random(q, DType::float32, rows * heads * dim, 22);
  table.upload();
  embrope::RopeCache cache({dim, 10000.0, max_pos}, gpu);
  embrope::RopeCache cpu_cache({dim, 10000.0, max_pos});
  auto set_all = [&](std::int64_t bad_row, std::int64_t bad) {
    for (std::int64_t n = 0; n < rows; ++n) {
      const std::int64_t v = n == bad_row ? bad : n % vocab;
      const auto v32 = static_cast<std::int32_t>(v);
      std::memcpy(ids.host.data() + 8 * n, &v, 8);
      std::memcpy(ids32.host.data() + 4 * n, &v32, 4);
      std::memcpy(pos.host.data() + 8 * n, &v, 8);
    }
    ids.upload();
    ids32.upload();
    pos.upload();
  };
  const std::int64_t extremes[] = {
      INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX, std::int64_t{1} << 32, -1};
  for (std::int64_t bad : extremes) {
    INFO("bad value " << bad);
    set_all(77, bad);
    const bool fits32 = bad >= INT32_MIN && bad <= INT32_MAX;
    out.poison_both(0xff);
    REQUIRE_THROWS_WITH(embrope::embed(Tensor(table.device, DType::float32, {vocab, dim}, gpu),
                                       Tensor(ids.device, DType::int64, {rows}, gpu),
                                       Tensor(out.device, DType::float32, {rows, dim}, gpu)),
                        Catch::Contains("ids[77] = " + std::to_string(bad)));
    const auto result = out.download();
    for (std::int64_t j = 0; j < dim; ++j) {
      REQUIRE(load_value(result.data(), DType::float32, 77 * dim + j) == 0.0f);
    }
    if (fits32) {
      REQUIRE_THROWS_WITH(embrope::embed(Tensor(table.device, DType::float32, {vocab, dim}, gpu),
                                         Tensor(ids32.device, DType::int32, {rows}, gpu),
                                         Tensor(out.device, DType::float32, {rows, dim}, gpu)),
                          Catch::Contains("ids[77] = " + std::to_string(bad)));
    }
    // The other op next, on the same context: exact against the CPU.
    q.upload();
    set_all(-1, 0);
    embrope::apply_rope(Tensor(q.device, DType::float32, {rows, heads, dim}, gpu), std::nullopt,
                        Tensor(pos.device, DType::int64, {rows}, gpu), cache);
    std::vector<unsigned char> expect(q.host);
    embrope::apply_rope(Tensor(expect.data(), DType::float32, {rows, heads, dim}), std::nullopt,
                        Tensor(pos.host.data(), DType::int64, {rows}), cpu_cache);
    compare_rows(q.download(), expect, DType::float32, rows * heads * dim, dim);

    // And the other way round: a bad position, then embed.
    set_all(77, bad);
    q.upload();
    REQUIRE_THROWS_WITH(
        embrope::apply_rope(Tensor(q.device, DType::float32, {rows, heads, dim}, gpu), std::nullopt,
                            Tensor(pos.device, DType::int64, {rows}, gpu), cache),
        Catch::Contains("positions[77] = " + std::to_string(bad)));
    set_all(-1, 0);
    embrope::embed(Tensor(table.device, DType::float32, {vocab, dim}, gpu),
                   Tensor(ids.device, DType::int64, {rows}, gpu),
                   Tensor(out.device, DType::float32, {rows, dim}, gpu));
    std::vector<unsigned char> expect_out(out.host.size());
    embrope::embed(Tensor(table.host.data(), DType::float32, {vocab, dim}),
                   Tensor(ids.host.data(), DType::int64, {rows}),
                   Tensor(expect_out.data(), DType::float32, {rows, dim}));
    compare_rows(out.download(), expect_out, DType::float32, rows * dim, dim);
  }
}
