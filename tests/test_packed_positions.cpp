// packed_positions: positions of a packed variable-length batch from cu_seqlens, against a
// plain loop over sequences; invalid cu_seqlens and start offsets reported like bad indices;
// and the use it exists for: RoPE of a packed batch equals RoPE of each sequence alone.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DeferredStatus;
using embrope::DType;
using embrope::ErrorCode;
using embrope::PackedPositionsOptions;
using embrope::Tensor;

// The expected positions, written from the definition: sequence b's k-th token is at
// start[b] + k.
std::vector<std::int64_t> expected_positions(const std::vector<std::int64_t>& seq_lens,
                                             const std::vector<std::int64_t>& starts) {
  std::vector<std::int64_t> out;
  for (std::size_t b = 0; b < seq_lens.size(); ++b) {
    for (std::int64_t k = 0; k < seq_lens[b]; ++k) {
      out.push_back((starts.empty() ? 0 : starts[b]) + k);
    }
  }
  return out;
}

ref::Buffer index_buffer(DType dtype, const std::vector<std::int64_t>& values) {
  ref::Buffer b(dtype, static_cast<std::int64_t>(values.size()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    b.set_index(static_cast<std::int64_t>(i), values[i]);
  }
  return b;
}

ref::Buffer cumulative(DType dtype, const std::vector<std::int64_t>& seq_lens) {
  std::vector<std::int64_t> cu = {0};
  for (std::int64_t n : seq_lens) cu.push_back(cu.back() + n);
  return index_buffer(dtype, cu);
}

}  // namespace

TEST_CASE("packed_positions numbers each sequence's tokens from its start offset",
          "[packed_positions]") {
  const DType cu_dtype = GENERATE(DType::int32, DType::int64);
  const DType pos_dtype = GENERATE(DType::int32, DType::int64);
  INFO("cu_seqlens " << embrope::dtype_name(cu_dtype) << " positions "
                     << embrope::dtype_name(pos_dtype));
  const std::vector<std::int64_t> seq_lens = {3, 0, 4, 1, 0, 9, 2};
  const std::vector<std::int64_t> starts = {0, 7, 100, 5, 0, 2147483647 - 8, 12};
  ref::Buffer cu = cumulative(cu_dtype, seq_lens);
  const auto t = static_cast<std::int64_t>(expected_positions(seq_lens, {}).size());
  for (const bool with_starts : {false, true}) {
    for (const bool strided : {false, true}) {
      INFO("starts " << with_starts << " strided " << strided);
      // Strided: positions every third element of a larger buffer; the rest must stay.
      const std::int64_t stride = strided ? 3 : 1;
      ref::Buffer pos(pos_dtype, t * stride);
      ref::poison(pos);
      const auto before = pos.snapshot();
      PackedPositionsOptions opt;
      ref::Buffer start = index_buffer(DType::int64, starts);
      if (with_starts) opt.start_offsets = ref::view(start, 0, {7});
      embrope::packed_positions(ref::view(cu, 0, {8}), ref::view(pos, 0, {t}, {stride}), opt);
      const auto want =
          expected_positions(seq_lens, with_starts ? starts : std::vector<std::int64_t>{});
      const auto after = pos.snapshot();
      for (std::int64_t i = 0; i < t * stride; ++i) {
        INFO("element " << i);
        if (i % stride == 0) {
          CHECK(pos.get_index(i) == want[static_cast<std::size_t>(i / stride)]);
        } else {
          CHECK(after[static_cast<std::size_t>(i)] == before[static_cast<std::size_t>(i)]);
        }
      }
    }
  }
}

TEST_CASE("packed_positions: no sequences, and sequences that are all empty",
          "[packed_positions]") {
  ref::Buffer cu0 = index_buffer(DType::int64, {0});
  ref::Buffer none(DType::int64, 0);
  CHECK_NOTHROW(embrope::packed_positions(ref::view(cu0, 0, {1}), ref::view(none, 0, {0})));
  ref::Buffer cu = index_buffer(DType::int64, {0, 0, 0});
  CHECK_NOTHROW(embrope::packed_positions(ref::view(cu, 0, {3}), ref::view(none, 0, {0})));
}

TEST_CASE("packed_positions reports an invalid cu_seqlens: first bad entry, its value, the rule",
          "[packed_positions][errors]") {
  struct Case {
    const char* what;
    std::vector<std::int64_t> cu;
    std::int64_t tokens;
    const char* entry;
    const char* value;
  };
  const Case cases[] = {
      {"first entry not 0", {1, 3, 6}, 6, "cu_seqlens[0]", "1"},
      {"decreasing", {0, 4, 2, 6}, 6, "cu_seqlens[2]", "2"},
      {"last entry not T", {0, 3, 5}, 6, "cu_seqlens[2]", "5"},
      {"beyond T", {0, 7, 7}, 6, "cu_seqlens[1]", "7"},
      {"negative", {0, -3, 6}, 6, "cu_seqlens[1]", "-3"},
      {"no sequences but tokens", {0}, 4, "cu_seqlens[0]", "0"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    ref::Buffer cu = index_buffer(DType::int64, k.cu);
    ref::Buffer pos(DType::int64, k.tokens);
    ref::poison(pos);
    const auto n = static_cast<std::int64_t>(k.cu.size());
    expect_error(
        [&] { embrope::packed_positions(ref::view(cu, 0, {n}), ref::view(pos, 0, {k.tokens})); },
        {ErrorCode::index_out_of_range}, {"packed_positions", k.entry, k.value});
    for (std::int64_t i = 0; i < k.tokens; ++i) CHECK(pos.get_index(i) == -1);

    DeferredStatus status;
    PackedPositionsOptions opt;
    opt.deferred = &status;
    embrope::packed_positions(ref::view(cu, 0, {n}), ref::view(pos, 0, {k.tokens}), opt);
    expect_error([&] { status.check(); }, {ErrorCode::index_out_of_range},
                 {"packed_positions", k.entry});
  }
}

TEST_CASE("packed_positions reports start offsets that are negative or overflow the dtype",
          "[packed_positions][errors]") {
  ref::Buffer cu = index_buffer(DType::int64, {0, 2, 5, 8});
  ref::Buffer pos(DType::int32, 8);
  // Sequence 1 has 3 tokens: a start of INT32_MAX - 2 still fits, INT32_MAX - 1 does not.
  ref::Buffer ok = index_buffer(DType::int64, {0, 2147483645, 4});
  PackedPositionsOptions opt;
  opt.start_offsets = ref::view(ok, 0, {3});
  embrope::packed_positions(ref::view(cu, 0, {4}), ref::view(pos, 0, {8}), opt);
  CHECK(pos.get_index(4) == 2147483647);
  ref::Buffer too_big = index_buffer(DType::int64, {0, 2147483646, 4});
  opt.start_offsets = ref::view(too_big, 0, {3});
  expect_error(
      [&] { embrope::packed_positions(ref::view(cu, 0, {4}), ref::view(pos, 0, {8}), opt); },
      {ErrorCode::index_out_of_range}, {"packed_positions", "start_offsets[1]", "2147483646"});
  CHECK(pos.get_index(2) == -1);
  CHECK(pos.get_index(0) == 0);  // the other sequences are still numbered
  CHECK(pos.get_index(7) == 6);
  ref::Buffer negative = index_buffer(DType::int32, {0, 0, -5});
  opt.start_offsets = ref::view(negative, 0, {3});
  expect_error(
      [&] { embrope::packed_positions(ref::view(cu, 0, {4}), ref::view(pos, 0, {8}), opt); },
      {ErrorCode::index_out_of_range}, {"packed_positions", "start_offsets[2]", "-5"});

  // Empty sequences have start offsets too: they are checked like any other.
  ref::Buffer with_empty = index_buffer(DType::int64, {0, 4, 4, 8});
  ref::Buffer empty_bad = index_buffer(DType::int64, {0, -5, 7});
  opt.start_offsets = ref::view(empty_bad, 0, {3});
  expect_error(
      [&] {
        embrope::packed_positions(ref::view(with_empty, 0, {4}), ref::view(pos, 0, {8}), opt);
      },
      {ErrorCode::index_out_of_range}, {"packed_positions", "start_offsets[1]", "-5"});
  CHECK(pos.get_index(0) == 0);
  CHECK(pos.get_index(4) == 7);
  // ... also when there are no tokens at all.
  ref::Buffer all_empty = index_buffer(DType::int64, {0, 0, 0});
  ref::Buffer none(DType::int32, 0);
  ref::Buffer no_tokens_bad = index_buffer(DType::int64, {3, -1});
  opt.start_offsets = ref::view(no_tokens_bad, 0, {2});
  expect_error(
      [&] {
        embrope::packed_positions(ref::view(all_empty, 0, {3}), ref::view(none, 0, {0}), opt);
      },
      {ErrorCode::index_out_of_range}, {"packed_positions", "start_offsets[1]", "-1"});
  // A bad cu_seqlens is reported alone, even after a bad start offset.
  ref::Buffer decreasing = index_buffer(DType::int64, {0, 4, 3, 8});
  ref::Buffer first_bad = index_buffer(DType::int64, {-1, 0, 0});
  opt.start_offsets = ref::view(first_bad, 0, {3});
  expect_error(
      [&] {
        embrope::packed_positions(ref::view(decreasing, 0, {4}), ref::view(pos, 0, {8}), opt);
      },
      {ErrorCode::index_out_of_range}, {"packed_positions", "cu_seqlens[2]", "3"});
  for (std::int64_t i = 0; i < 8; ++i) CHECK(pos.get_index(i) == -1);
}

TEST_CASE("packed_positions rejects bad shapes and dtypes", "[packed_positions][errors]") {
  ref::Buffer cu = index_buffer(DType::int64, {0, 2, 5});
  ref::Buffer pos(DType::int64, 5), fpos(DType::float32, 5), starts(DType::int64, 3);
  expect_error(
      [&] {
        embrope::packed_positions(ref::view(cu, 0, {1, 3}), ref::view(pos, 0, {5}));
      },
      {ErrorCode::invalid_argument}, {"packed_positions", "cu_seqlens"});
  expect_error([&] { embrope::packed_positions(ref::view(cu, 0, {0}), ref::view(pos, 0, {5})); },
               {ErrorCode::invalid_argument}, {"packed_positions", "cu_seqlens", "B + 1"});
  expect_error([&] { embrope::packed_positions(ref::view(cu, 0, {3}), ref::view(fpos, 0, {5})); },
               {ErrorCode::invalid_argument}, {"packed_positions", "positions"});
  PackedPositionsOptions opt;
  opt.start_offsets = ref::view(starts, 0, {3});
  expect_error(
      [&] { embrope::packed_positions(ref::view(cu, 0, {3}), ref::view(pos, 0, {5}), opt); },
      {ErrorCode::invalid_argument}, {"packed_positions", "start_offsets", "B"});
}

TEST_CASE("RoPE of a packed batch with packed_positions equals RoPE of each sequence alone",
          "[packed_positions][rope]") {
  const std::vector<std::int64_t> seq_lens = {5, 1, 8, 3};
  const std::vector<std::int64_t> starts = {0, 40, 3, 17};
  const std::int64_t t = 17, h = 4, d = 64;
  ref::Buffer cu = cumulative(DType::int32, seq_lens), start = index_buffer(DType::int32, starts);
  ref::Buffer q(DType::bfloat16, t * h * d), pos(DType::int32, t);
  ref::fill_random(q, 404);
  ref::Buffer separate = q;
  const embrope::RopeCache cache(embrope::RopeConfig{d, 10000.0, 64});
  PackedPositionsOptions opt;
  opt.start_offsets = ref::view(start, 0, {4});
  embrope::packed_positions(ref::view(cu, 0, {5}), ref::view(pos, 0, {t}), opt);
  embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}), cache);
  // Each sequence alone, as a [1, len] batch with implicit-looking explicit positions.
  std::int64_t first = 0;
  for (std::size_t b = 0; b < seq_lens.size(); ++b) {
    const std::int64_t n = seq_lens[b];
    ref::Buffer own(DType::int64, n);
    for (std::int64_t k = 0; k < n; ++k) own.set_index(k, starts[b] + k);
    embrope::apply_rope(ref::view(separate, first * h * d, {n, h, d}), std::nullopt,
                        ref::view(own, 0, {n}), cache);
    first += n;
  }
  CHECK(q.snapshot() == separate.snapshot());
}

TEST_CASE("embrope_packed_positions through the C API", "[packed_positions][c_api]") {
  std::int64_t cu[] = {0, 2, 2, 5};
  std::int64_t starts[] = {10, 0, 3};
  std::int32_t pos[5] = {};
  std::int64_t cu_shape[] = {4}, start_shape[] = {3}, pos_shape[] = {5};
  const DLDevice cpu{kDLCPU, 0};
  DLTensor cu_t{cu, cpu, 1, {kDLInt, 64, 1}, cu_shape, nullptr, 0};
  DLTensor start_t{starts, cpu, 1, {kDLInt, 64, 1}, start_shape, nullptr, 0};
  DLTensor pos_t{pos, cpu, 1, {kDLInt, 32, 1}, pos_shape, nullptr, 0};
  REQUIRE(embrope_packed_positions(&cu_t, &start_t, &pos_t, nullptr, nullptr) == EMBROPE_OK);
  CHECK(std::vector<std::int32_t>(pos, pos + 5) == std::vector<std::int32_t>{10, 11, 3, 4, 5});
  cu[3] = 4;
  CHECK(embrope_packed_positions(&cu_t, nullptr, &pos_t, nullptr, nullptr) ==
        EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
  CHECK(ref::mentions(embrope_last_error(), "cu_seqlens[3]"));
  CHECK(embrope_packed_positions(nullptr, nullptr, &pos_t, nullptr, nullptr) ==
        EMBROPE_ERROR_INVALID_ARGUMENT);
  // Deferred: the call succeeds, the check reports the entry.
  embrope_deferred_status_t* status = nullptr;
  REQUIRE(embrope_deferred_status_create(DLDevice{kDLCPU, 0}, &status) == EMBROPE_OK);
  CHECK(embrope_packed_positions(&cu_t, nullptr, &pos_t, status, nullptr) == EMBROPE_OK);
  CHECK(embrope_deferred_status_check(status, nullptr) == EMBROPE_ERROR_INDEX_OUT_OF_RANGE);
  CHECK(ref::mentions(embrope_last_error(), "cu_seqlens[3]"));
  CHECK(embrope_deferred_status_check(status, nullptr) == EMBROPE_OK);
  CHECK(embrope_deferred_status_destroy(status) == EMBROPE_OK);
}

TEST_CASE("packed_positions_workspace_size: none on the CPU, arguments validated as by the call",
          "[packed_positions]") {
  std::vector<std::int64_t> cu = {0, 2, 5};
  std::vector<std::int64_t> positions(5);
  const Tensor cu_t(cu.data(), DType::int64, {3});
  CHECK(embrope::packed_positions_workspace_size(cu_t,
                                                 Tensor(positions.data(), DType::int64, {5})) == 0);
  try {
    embrope::packed_positions_workspace_size(cu_t, Tensor(positions.data(), DType::float32, {5}));
    FAIL("no error for float32 positions");
  } catch (const embrope::Error& e) {
    CHECK(e.code() == embrope::ErrorCode::invalid_argument);
    CHECK(std::string(e.what()).find("packed_positions: positions has dtype float32") == 0);
  }
}
