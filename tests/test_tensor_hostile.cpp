// Hostile arguments to the Tensor constructor (docs/ops.md, docs/errors.md): bad ranks, a null
// shape, too few strides. Every op's own cases build tensors too; these are the constructor's.
// The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "tensor";

std::vector<CallCase> tensor_cases() {
  std::vector<CallCase> cases;
  cases.push_back({"Tensor of rank 9", "Tensor", invalid({"ndim", "9"}),
                   [] {
                     return run_cpp([] {
                       const std::int64_t shape[9] = {};
                       Tensor t(nullptr, DType::float32, 9, shape, nullptr);
                     });
                   },
                   Surface::cpp});
  cases.push_back(
      {"Tensor of rank -1", "Tensor", invalid({"ndim", "-1"}),
       [] { return run_cpp([] { Tensor t(nullptr, DType::float32, -1, nullptr, nullptr); }); },
       Surface::cpp});
  cases.push_back(
      {"Tensor with a null shape", "Tensor", invalid({"shape", "null"}),
       [] { return run_cpp([] { Tensor t(nullptr, DType::float32, 2, nullptr, nullptr); }); },
       Surface::cpp});
  cases.push_back({"Tensor with fewer strides than dimensions", "Tensor", invalid({"strides"}),
                   [] { return run_cpp([] {
                          Tensor t(nullptr, DType::float32, {2, 3}, {1});
                        }); },
                   Surface::cpp});
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> tensor_hostile_case_names() {
  return names_of(kGroup, tensor_cases());
}

TEST_CASE("hostile inputs: Tensor", "[hostile][tensor]") {
  run_call_cases(kGroup, tensor_cases());
}
