// Hostile inputs to the C deferred-status functions (docs/ops.md, docs/errors.md): NULL
// handles and out-parameters, an unknown device type. The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "deferred_status";

std::vector<ArenaCase> deferred_status_cases() {
  std::vector<ArenaCase> cases;
  // ---- deferred statuses.
  cases.push_back(
      {"embrope_deferred_status_create NULL out", "embrope_deferred_status_create",
       invalid({"status", "null"}), Surface::c, [](Arena& arena) {
         arena.seal();
         return from_status(embrope_deferred_status_create(DLDevice{kDLCPU, 0}, nullptr));
       }});
  cases.push_back({"embrope_deferred_status_check NULL", "embrope_deferred_status_check",
                   invalid({"status", "null"}), Surface::c, [](Arena& arena) {
                     arena.seal();
                     return from_status(embrope_deferred_status_check(nullptr, nullptr));
                   }});
  cases.push_back({"embrope_deferred_status_create device type 99",
                   "embrope_deferred_status_create", invalid({"device"}), Surface::c,
                   [](Arena& arena) {
                     arena.seal();
                     embrope_deferred_status_t* s = nullptr;
                     const int type = 99;
                     DLDevice dev{};
                     std::memcpy(&dev.device_type, &type, sizeof type);
                     const Outcome o = from_status(embrope_deferred_status_create(dev, &s));
                     CHECK(s == nullptr);
                     return o;
                   }});
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> deferred_status_hostile_case_names() {
  return names_of(kGroup, deferred_status_cases());
}

TEST_CASE("hostile inputs: DeferredStatus through the C API", "[hostile][deferred_status]") {
  run_arena_cases(kGroup, deferred_status_cases());
}
