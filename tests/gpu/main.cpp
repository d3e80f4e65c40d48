// The GPU suite runs only where a GPU is usable; elsewhere it exits with 77, which ctest
// reports as "skipped" (SKIP_RETURN_CODE), never as "passed".
// Catch2's implementation is compiled in this unit alone. Nothing in it is timed or under test,
// and GCC's optimiser takes most of its compile time: under ASan + UBSan it compiles in 165 s
// at -O2, in 24 s at -O0. The test cases' own units are compiled as configured.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O0")
#endif
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (embrope::cuda_device_count() == 0) {
    std::printf("embrope GPU tests: no usable CUDA device: skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
