// packed_positions on the GPU against the CPU: positions, bad cu_seqlens and start offsets
// reported as the CPU reports them, the context usable afterwards.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"

using namespace gpu_test;

TEST_CASE("GPU packed_positions equals the CPU, bad cu_seqlens reported, context usable",
          "[gpu][packed_positions]") {
  for (std::int64_t sequences : {1, 7, 3000}) {
    for (DType pos_dtype : {DType::int32, DType::int64}) {
      INFO("B " << sequences << " positions " << embrope::dtype_name(pos_dtype));
      std::mt19937_64 rng(sequences);
      std::vector<std::int64_t> cu = {0}, starts;
      for (std::int64_t b = 0; b < sequences; ++b) {
        const std::int64_t len = rng() % 5 == 0 ? 0 : static_cast<std::int64_t>(rng() % 700);
        cu.push_back(cu.back() + len);
        starts.push_back(static_cast<std::int64_t>(rng() % 100000));
      }
      const std::int64_t tokens = cu.back();
      const int es = embrope::dtype_size(pos_dtype);
      Buffer cu_b(cu.size() * 8), start_b(starts.size() * 8), pos(tokens * es + 1);
      std::memcpy(cu_b.host.data(), cu.data(), cu.size() * 8);
      std::memcpy(start_b.host.data(), starts.data(), starts.size() * 8);
      cu_b.upload();
      start_b.upload();
      pos.poison_both(0xee);
      const Device g = Device::cuda(0);
      embrope::PackedPositionsOptions cpu_opt, gpu_opt;
      cpu_opt.start_offsets = Tensor(start_b.host.data(), DType::int64, {sequences});
      gpu_opt.start_offsets = Tensor(start_b.device, DType::int64, {sequences}, g);
      embrope::packed_positions(Tensor(cu_b.host.data(), DType::int64, {sequences + 1}),
                                Tensor(pos.host.data(), pos_dtype, {tokens}), cpu_opt);
      embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
      REQUIRE(pos.download() == pos.host);

      // A decreasing entry: reported by index and value; then the next call works.
      if (sequences >= 7) {
        std::vector<std::int64_t> bad = cu;
        bad[4] = bad[3] - 1;
        std::memcpy(cu_b.host.data(), bad.data(), bad.size() * 8);
        cu_b.upload();
        try {
          embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                    Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
          FAIL("no error for a decreasing cu_seqlens");
        } catch (const embrope::Error& e) {
          CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
          CHECK(std::string(e.what()).find("cu_seqlens[4]") != std::string::npos);
        }
        std::memcpy(cu_b.host.data(), cu.data(), cu.size() * 8);
        cu_b.upload();
        embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                  Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
        REQUIRE(pos.download() == pos.host);
      }
    }
  }
}

// Bad cu_seqlens and start offsets: the GPU reports what the CPU reports (the first bad
// entry, a bad cu_seqlens before any start offset), writes the same -1 positions, and never
// touches memory outside its buffers (compute-sanitizer watches the negative entries).
TEST_CASE("GPU packed_positions reports bad entries as the CPU does", "[gpu][packed_positions]") {
  const std::int64_t big = std::int64_t{1} << 40;
  struct Case {
    const char* name;
    std::vector<std::int64_t> cu, starts;  // starts empty: no start_offsets
    const char* expected;                  // in the message, or null for no error
  };
  const std::vector<Case> cases = {
      {"negative entries after a bad one", {0, 4, -big, -big / 2, -3, 10}, {}, "cu_seqlens[2]"},
      {"a small negative entry after a bad one", {0, 4, -2, -1, 10}, {}, "cu_seqlens[2]"},
      {"a bad start of an empty sequence", {0, 4, 4, 10}, {0, -5, 7}, "start_offsets[1]"},
      {"bad starts and no tokens", {0, 0, 0}, {3, -1}, "start_offsets[1]"},
      {"a bad start before a bad cu_seqlens", {0, 4, 3, 10}, {-1, 0, 0}, "cu_seqlens[2]"},
      {"good starts and no tokens", {0, 0, 0, 0}, {1, 2, 3}, nullptr},
  };
  for (const Case& c : cases) {
    for (DType pos_dtype : {DType::int32, DType::int64}) {
      INFO(c.name << ", positions " << embrope::dtype_name(pos_dtype));
      const auto sequences = static_cast<std::int64_t>(c.cu.size()) - 1;
      const std::int64_t tokens = c.cu.back() < 0 ? 0 : c.cu.back();
      const int es = embrope::dtype_size(pos_dtype);
      Buffer cu_b(c.cu.size() * 8), start_b(c.starts.size() * 8), pos(tokens * es);
      std::memcpy(cu_b.host.data(), c.cu.data(), c.cu.size() * 8);
      if (!c.starts.empty()) std::memcpy(start_b.host.data(), c.starts.data(), c.starts.size() * 8);
      cu_b.upload();
      start_b.upload();
      pos.poison_both(0xee);
      const Device g = Device::cuda(0);
      embrope::PackedPositionsOptions cpu_opt, gpu_opt;
      if (!c.starts.empty()) {
        cpu_opt.start_offsets = Tensor(start_b.host.data(), DType::int64, {sequences});
        gpu_opt.start_offsets = Tensor(start_b.device, DType::int64, {sequences}, g);
      }
      auto message = [](auto&& call) -> std::string {
        try {
          call();
        } catch (const embrope::Error& e) {
          CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
          return e.what();
        }
        return "";
      };
      const std::string cpu_error = message([&] {
        embrope::packed_positions(Tensor(cu_b.host.data(), DType::int64, {sequences + 1}),
                                  Tensor(pos.host.data(), pos_dtype, {tokens}), cpu_opt);
      });
      const std::string gpu_error = message([&] {
        embrope::packed_positions(Tensor(cu_b.device, DType::int64, {sequences + 1}, g),
                                  Tensor(pos.device, pos_dtype, {tokens}, g), gpu_opt);
      });
      CHECK(gpu_error == cpu_error);
      if (c.expected == nullptr) {
        CHECK(cpu_error.empty());
      } else {
        CHECK(cpu_error.find(c.expected) != std::string::npos);
      }
      REQUIRE(pos.download() == pos.host);
      // The context stays usable: a valid call afterwards.
      const std::vector<std::int64_t> good = {0, 2, 5};
      Buffer good_b(good.size() * 8), good_pos(5 * 8);
      std::memcpy(good_b.host.data(), good.data(), good.size() * 8);
      good_b.upload();
      embrope::packed_positions(Tensor(good_b.device, DType::int64, {3}, g),
                                Tensor(good_pos.device, DType::int64, {5}, g));
      const std::vector<unsigned char> got = good_pos.download();
      std::int64_t values[5];
      std::memcpy(values, got.data(), sizeof values);
      CHECK(
          (values[0] == 0 && values[1] == 1 && values[2] == 0 && values[3] == 1 && values[4] == 2));
    }
  }
}

// The two-phase workspace: the size query, then a caller's buffer of exactly that many bytes
// (here starting one byte into an allocation: the call aligns it); a smaller one is rejected
// before any launch, naming the sizes.
TEST_CASE("GPU packed_positions with a caller workspace equals the CPU; too small is rejected",
          "[gpu][packed_positions]") {
  const std::vector<std::int64_t> cu = {0, 5, 5, 300, 1000};
  const std::vector<std::int64_t> starts = {7, 0, 123456, 9};
  const std::int64_t sequences = 4, tokens = cu.back();
  Buffer cu_b(cu.size() * 8), start_b(starts.size() * 8), pos(tokens * 8);
  std::memcpy(cu_b.host.data(), cu.data(), cu.size() * 8);
  std::memcpy(start_b.host.data(), starts.data(), starts.size() * 8);
  cu_b.upload();
  start_b.upload();
  pos.poison_both(0xee);
  const Device g = Device::cuda(0);
  embrope::PackedPositionsOptions cpu_opt, gpu_opt;
  cpu_opt.start_offsets = Tensor(start_b.host.data(), DType::int64, {sequences});
  gpu_opt.start_offsets = Tensor(start_b.device, DType::int64, {sequences}, g);
  const Tensor gpu_cu(cu_b.device, DType::int64, {sequences + 1}, g);
  const Tensor gpu_pos(pos.device, DType::int64, {tokens}, g);
  embrope::packed_positions(Tensor(cu_b.host.data(), DType::int64, {sequences + 1}),
                            Tensor(pos.host.data(), DType::int64, {tokens}), cpu_opt);

  const std::size_t bytes = embrope::packed_positions_workspace_size(gpu_cu, gpu_pos, gpu_opt);
  REQUIRE(bytes >= static_cast<std::size_t>(2 * tokens) * sizeof(int));
  Buffer workspace(bytes + 1);
  gpu_opt.workspace = static_cast<char*>(workspace.device) + 1;
  gpu_opt.workspace_bytes = bytes;
  embrope::packed_positions(gpu_cu, gpu_pos, gpu_opt);
  REQUIRE(pos.download() == pos.host);

  pos.poison_both(0xee);
  gpu_opt.workspace_bytes = bytes - 1;
  try {
    embrope::packed_positions(gpu_cu, gpu_pos, gpu_opt);
    FAIL("no error for a workspace one byte too small");
  } catch (const embrope::Error& e) {
    CHECK(e.code() == embrope::ErrorCode::invalid_argument);
    CHECK(std::string(e.what()).find("packed_positions: workspace_bytes") == 0);
  }
  CHECK(pos.download() == pos.host);  // nothing written
}
