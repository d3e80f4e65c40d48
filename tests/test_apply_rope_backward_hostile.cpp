// Hostile inputs to apply_rope_backward and embrope_apply_rope_backward (docs/ops.md,
// docs/errors.md): the forward's checks under the backward's name. The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "apply_rope_backward";

std::vector<ArenaCase> apply_rope_backward_cases() {
  std::vector<ArenaCase> cases;
  // ---- apply_rope_backward: the forward's checks under the backward's name.
  for (const Surface surface : {Surface::cpp, Surface::c}) {
    const bool cpp = surface == Surface::cpp;
    for (int variant = 0; variant < 3; ++variant) {
      const char* what[] = {"valid", "a position of INT64_MIN", "dq of dtype int64"};
      cases.push_back(
          {std::string(cpp ? "apply_rope_backward " : "embrope_apply_rope_backward ") +
               what[variant],
           cpp ? "apply_rope_backward" : "embrope_apply_rope_backward",
           variant == 0   ? ok()
           : variant == 1 ? bad_index({"positions[1]"})
                          : invalid({"dq"}),
           surface, [variant, cpp](Arena& arena) {
             const std::int64_t t = 3, h = 2, d = 16;
             Region dq = arena.region(variant == 2 ? DType::int64 : DType::float32, t * h * d);
             Region pos = arena.region(DType::int64, t);
             if (variant != 2) {
               for (std::int64_t i = 0; i < t * h * d; ++i) dq.set(i, 0.5);
             }
             for (std::int64_t i = 0; i < t; ++i) pos.set_index(i, i);
             if (variant == 1) pos.set_index(1, kI64Min);
             const embrope::RopeCache cache(embrope::RopeConfig{d, 10000.0, 8});
             arena.seal();
             const Tensor q = view_of(dq, {t, h, d}), p = view_of(pos, {t});
             if (cpp) {
               return run_cpp([&] { embrope::apply_rope_backward(q, std::nullopt, p, cache); });
             }
             embrope_rope_config_t c;
             embrope_rope_config_init(&c);
             c.rotary_dim = d;
             c.max_positions = 8;
             embrope_rope_cache_t* handle = nullptr;
             REQUIRE(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &handle) ==
                     EMBROPE_OK);
             DLView qv(q), pv(p);
             const Outcome o = from_status(embrope_apply_rope_backward(qv.get(), nullptr, pv.get(),
                                                                       handle, nullptr, nullptr));
             embrope_rope_cache_destroy(handle);
             return o;
           }});
    }
  }
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> apply_rope_backward_hostile_case_names() {
  return names_of(kGroup, apply_rope_backward_cases());
}

TEST_CASE("hostile inputs: apply_rope_backward, C++ and C", "[hostile][apply_rope_backward]") {
  run_arena_cases(kGroup, apply_rope_backward_cases());
}
