// Hostile inputs to packed_positions and embrope_packed_positions (docs/ops.md, docs/errors.md):
// bad dtypes and shapes, positions aliasing cu_seqlens, cu_seqlens and start offsets at the
// int32/int64 limits, a NULL cu_seqlens. The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "packed_positions";

std::vector<ArenaCase> packed_positions_cases() {
  std::vector<ArenaCase> cases;
  // ---- packed_positions: cu_seqlens [B + 1], positions [T], start_offsets [B].
  struct Packed {
    std::string name;
    std::vector<std::int64_t> cu;
    std::vector<std::int64_t> starts;  // empty: absent
    std::int64_t tokens;
    DType cu_dtype, pos_dtype;
    int layout;  // 0 plain, 1 cu 2-D, 2 positions alias cu_seqlens, 3 positions zero stride
    Expect expect;
  };
  const DType i64 = DType::int64, i32 = DType::int32, f32 = DType::float32;
  const std::vector<Packed> packed = {
      {"valid", {0, 2, 2, 5}, {0, 7, 1}, 5, i64, i32, 0, ok()},
      {"cu_seqlens float32", {0, 2, 5}, {}, 5, f32, i64, 0, invalid({"cu_seqlens", "int32"})},
      {"positions float32", {0, 2, 5}, {}, 5, i64, f32, 0, invalid({"positions", "int32"})},
      {"cu_seqlens 2-D", {0, 2, 5, 5}, {}, 5, i64, i64, 1, invalid({"cu_seqlens"})},
      {"cu_seqlens empty", {}, {}, 0, i64, i64, 0, invalid({"cu_seqlens", "B + 1"})},
      {"start_offsets of the wrong length",
       {0, 2, 5},
       {0, 0, 0},
       5,
       i64,
       i64,
       0,
       invalid({"start_offsets"})},
      {"positions aliasing cu_seqlens",
       {0, 1, 2, 3},
       {},
       3,
       i64,
       i64,
       2,
       invalid({"positions", "cu_seqlens"})},
      {"positions with stride 0", {0, 4}, {}, 4, i64, i64, 3, invalid({"positions"})},
      {"cu_seqlens decreasing", {0, 4, 2, 6}, {}, 6, i64, i64, 0, bad_index({"cu_seqlens[2]"})},
      {"cu_seqlens INT64_MIN", {0, kI64Min, 6}, {}, 6, i64, i64, 0, bad_index({"cu_seqlens[1]"})},
      {"cu_seqlens ends at INT64_MAX",
       {0, 3, kI64Max},
       {},
       6,
       i64,
       i64,
       0,
       bad_index({"cu_seqlens[2]"})},
      {"cu_seqlens INT32_MIN (int32)",
       {0, kI32Min, 6},
       {},
       6,
       i32,
       i64,
       0,
       bad_index({"cu_seqlens[1]"})},
      {"cu_seqlens first entry 1", {1, 3, 6}, {}, 6, i64, i64, 0, bad_index({"cu_seqlens[0]"})},
      {"start_offsets INT64_MAX",
       {0, 3, 6},
       {kI64Max, 0},
       6,
       i64,
       i64,
       0,
       bad_index({"start_offsets[0]"})},
      {"start_offsets INT64_MIN",
       {0, 3, 6},
       {0, kI64Min},
       6,
       i64,
       i64,
       0,
       bad_index({"start_offsets[1]"})},
      {"start_offsets past INT32_MAX for int32 positions",
       {0, 3, 6},
       {0, kI32Max - 1},
       6,
       i64,
       i32,
       0,
       bad_index({"start_offsets[1]"})},
  };
  for (const Packed& k : packed) {
    for (const Surface surface : {Surface::cpp, Surface::c}) {
      const bool cpp = surface == Surface::cpp;
      cases.push_back({(cpp ? "packed_positions " : "embrope_packed_positions ") + k.name,
                       cpp ? "packed_positions" : "embrope_packed_positions", k.expect, surface,
                       [k, cpp](Arena& arena) {
                         const auto n_cu = static_cast<std::int64_t>(k.cu.size());
                         Region cu = arena.region(k.cu_dtype, std::max<std::int64_t>(n_cu, 1));
                         for (std::int64_t i = 0; i < n_cu; ++i) {
                           if (k.cu_dtype == DType::float32) {
                             cu.set(i, static_cast<double>(k.cu[static_cast<std::size_t>(i)]));
                           } else {
                             cu.set_index(i, k.cu[static_cast<std::size_t>(i)]);
                           }
                         }
                         Region pos =
                             arena.region(k.pos_dtype, std::max<std::int64_t>(k.tokens, 1));
                         Region start =
                             arena.region(DType::int64, std::max<std::size_t>(k.starts.size(), 1));
                         for (std::size_t i = 0; i < k.starts.size(); ++i) {
                           start.set_index(static_cast<std::int64_t>(i), k.starts[i]);
                         }
                         Tensor cu_t = k.layout == 1 ? view_of(cu, {2, 2}) : view_of(cu, {n_cu});
                         Tensor pos_t = view_of(pos, {k.tokens});
                         if (k.layout == 2) pos_t = view_of(cu, {k.tokens});
                         if (k.layout == 3) pos_t = view_of(pos, {k.tokens}, {0});
                         std::optional<Tensor> start_t;
                         if (!k.starts.empty()) {
                           start_t = view_of(start, {static_cast<std::int64_t>(k.starts.size())});
                         }
                         arena.seal();
                         if (cpp) {
                           return run_cpp([&] {
                             embrope::PackedPositionsOptions o;
                             o.start_offsets = start_t;
                             embrope::packed_positions(cu_t, pos_t, o);
                           });
                         }
                         DLView cv(cu_t), pv(pos_t);
                         std::optional<DLView> sv;
                         if (start_t) sv.emplace(*start_t);
                         return from_status(embrope_packed_positions(
                             cv.get(), sv ? sv->get() : nullptr, pv.get(), nullptr, nullptr));
                       }});
    }
  }
  cases.push_back({"embrope_packed_positions NULL cu_seqlens", "embrope_packed_positions",
                   invalid({"cu_seqlens", "null"}), Surface::c, [](Arena& arena) {
                     Region pos = arena.region(DType::int64, 4);
                     arena.seal();
                     DLView pv(view_of(pos, {4}));
                     return from_status(
                         embrope_packed_positions(nullptr, nullptr, pv.get(), nullptr, nullptr));
                   }});
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> packed_positions_hostile_case_names() {
  return names_of(kGroup, packed_positions_cases());
}

TEST_CASE("hostile inputs: packed_positions, C++ and C", "[hostile][packed_positions]") {
  run_arena_cases(kGroup, packed_positions_cases());
}
