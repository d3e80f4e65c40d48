// The GPU suite runs only where a GPU is usable; elsewhere it exits with 77, which ctest
// reports as "skipped" (SKIP_RETURN_CODE), never as "passed".
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
