// Hostile inputs to embed_backward and embrope_embed_backward (docs/ops.md, docs/errors.md):
// bad dtypes and shapes, aliasing gradients, zero strides, ids at the int64 limits, a NaN
// scale, no gradient at all, an unknown mode. The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "embed_backward";

std::vector<ArenaCase> embed_backward_cases() {
  std::vector<ArenaCase> cases;
  // ---- embed_backward: grad_out [N, D], ids [N], grad_table [V, D].
  struct Backward {
    std::string name;
    int variant;
    Expect expect;
  };
  const std::vector<Backward> backward = {
      {"valid", 0, ok()},
      {"grad_out int32", 1, invalid({"grad_out"})},
      {"grad_table of another D", 2, invalid({"grad_table"})},
      {"ids of another length", 3, invalid({"grad_out"})},
      {"grad_table aliasing grad_out", 4, invalid({"grad_table", "grad_out"})},
      {"grad_table with row stride 0", 5, invalid({"grad_table"})},
      {"an id of INT64_MIN", 6, bad_index({"ids[1]"})},
      {"an id equal to V", 7, bad_index({"ids[2]"})},
      {"scale NaN", 8, invalid({"scale", "finite"})},
      {"no gradient at all", 9, invalid({"no gradient"})},
      {"grad_position_table aliasing grad_table", 10,
       invalid({"grad_table", "grad_position_table"})},
  };
  for (const Backward& k : backward) {
    for (const Surface surface : {Surface::cpp, Surface::c}) {
      const bool cpp = surface == Surface::cpp;
      cases.push_back({(cpp ? "embed_backward " : "embrope_embed_backward ") + k.name,
                       cpp ? "embed_backward" : "embrope_embed_backward", k.expect, surface,
                       [k, cpp](Arena& arena) {
                         const std::int64_t n = 4, d = 8, v = 6, p = 8;
                         Region grad_out =
                             arena.region(k.variant == 1 ? DType::int32 : DType::float32, n * d);
                         Region ids = arena.region(DType::int64, n);
                         Region grad = arena.region(DType::float32, v * (d + 4));
                         for (std::int64_t i = 0; i < n * d; ++i)
                           grad_out.set(i, 0.25 * (i % 7) - 0.5);
                         for (std::int64_t i = 0; i < n; ++i) ids.set_index(i, i % v);
                         if (k.variant == 6) ids.set_index(1, kI64Min);
                         if (k.variant == 7) ids.set_index(2, v);
                         Tensor go = view_of(grad_out, {n, d});
                         Tensor id = view_of(ids, {k.variant == 3 ? n - 1 : n});
                         std::optional<Tensor> gt = view_of(grad, {v, k.variant == 2 ? d + 1 : d});
                         if (k.variant == 4) gt = view_of(grad_out, {n, d});
                         if (k.variant == 5) gt = view_of(grad, {v, d}, {0, 1});
                         if (k.variant == 9) gt.reset();
                         embrope::EmbedBackwardOptions o;
                         if (k.variant == 8) o.scale = std::nanf("");
                         if (k.variant == 10) {
                           o.grad_position_table = view_of(grad, {p / 2, d});
                         }
                         arena.seal();
                         if (cpp) return run_cpp([&] { embrope::embed_backward(go, id, gt, o); });
                         DLView gov(go), idv(id);
                         std::optional<DLView> gtv, gpv;
                         if (gt) gtv.emplace(*gt);
                         embrope_embed_backward_options_t co;
                         embrope_embed_backward_options_init(&co);
                         co.scale = o.scale;
                         if (o.grad_position_table) {
                           gpv.emplace(*o.grad_position_table);
                           co.grad_position_table = gpv->get();
                         }
                         return from_status(embrope_embed_backward(
                             gov.get(), idv.get(), gtv ? gtv->get() : nullptr, &co, nullptr));
                       }});
    }
  }
  cases.push_back(
      {"embrope_embed_backward mode 7", "embrope_embed_backward", invalid({"mode", "7"}),
       Surface::c, [](Arena& arena) {
         Region go = arena.region(DType::float32, 8), ids = arena.region(DType::int64, 1),
                gt = arena.region(DType::float32, 16);
         ids.set_index(0, 0);
         arena.seal();
         DLView gov(view_of(go, {1, 8})), idv(view_of(ids, {1})), gtv(view_of(gt, {2, 8}));
         embrope_embed_backward_options_t co;
         embrope_embed_backward_options_init(&co);
         const int seven = 7;
         std::memcpy(&co.mode, &seven, sizeof seven);
         return from_status(embrope_embed_backward(gov.get(), idv.get(), gtv.get(), &co, nullptr));
       }});
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> embed_backward_hostile_case_names() {
  return names_of(kGroup, embed_backward_cases());
}

TEST_CASE("hostile inputs: embed_backward, C++ and C", "[hostile][embed_backward]") {
  run_arena_cases(kGroup, embed_backward_cases());
}
