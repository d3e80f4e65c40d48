// The hostile-input cases of every op together (tests/test_*_hostile.cpp): every case has its
// own name within its group, and the total number of calls, which docs/testing.md quotes, is
// printed (each case on each surface and table kind is one call).
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hostile.hpp"

TEST_CASE("hostile inputs: every case has its own name; the number of cases", "[hostile][count]") {
  using hostile::kC;
  using hostile::kCpp;
  const std::vector<std::vector<hostile::CaseName>> lists = {
      embed_hostile_case_names(),
      embed_backward_hostile_case_names(),
      apply_rope_hostile_case_names(),
      apply_rope_backward_hostile_case_names(),
      packed_positions_hostile_case_names(),
      rope_cache_hostile_case_names(),
      model_config_hostile_case_names(),
      deferred_status_hostile_case_names(),
      tensor_hostile_case_names(),
  };
  // Cases are told apart by name (Catch2 sections): a repeated name within a group would
  // silently skip one.
  int cpp = 0, c = 0;
  std::set<std::pair<std::string, std::string>> names;
  std::map<std::string, hostile::Calls> listed;
  for (const std::vector<hostile::CaseName>& list : lists) {
    for (const hostile::CaseName& n : list) {
      INFO("case: " << n.group << ": " << n.name);
      CHECK(names.insert({n.group, n.name}).second);
      if (n.surfaces & kCpp) {
        cpp += n.calls;
        listed[n.group].cpp += n.calls;
      }
      if (n.surfaces & kC) {
        c += n.calls;
        listed[n.group].c += n.calls;
      }
    }
  }
  for (const auto& [group, calls] : listed) {
    std::printf("hostile inputs: %s: %d C++ calls, %d C calls\n", group.c_str(), calls.cpp,
                calls.c);
  }
  // The figure docs/testing.md quotes (each case on each surface and table kind is one call).
  std::printf("hostile inputs: %d C++ calls, %d C calls, %d in all\n", cpp, c, cpp + c);
  // Each group whose test case ran earlier in this process ran exactly the cases listed.
  for (const auto& [group, made] : hostile::calls_made()) {
    INFO("group: " << group);
    const hostile::Calls want = listed.count(group) ? listed.at(group) : hostile::Calls{};
    CHECK(made.cpp == want.cpp);
    CHECK(made.c == want.c);
  }
}
