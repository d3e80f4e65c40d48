# Build options of embrope.
set(EMBROPE_CUDA AUTO CACHE STRING "Build the CUDA kernels: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE EMBROPE_CUDA PROPERTY STRINGS AUTO ON OFF)
option(EMBROPE_BUILD_TESTS "Build the tests" ${PROJECT_IS_TOP_LEVEL})
option(EMBROPE_BUILD_BENCHMARKS "Build the benchmark executable" ${PROJECT_IS_TOP_LEVEL})
option(EMBROPE_BUILD_EXAMPLES "Build the examples" ${PROJECT_IS_TOP_LEVEL})
set(EMBROPE_CONFORMANCE_DIR "${PROJECT_SOURCE_DIR}/../shared/conformance/onnx-rotary-embedding"
    CACHE PATH "ONNX RotaryEmbedding conformance vectors (JSON)")
option(EMBROPE_REQUIRE_CONFORMANCE "Fail to configure when the ONNX vectors are missing" OFF)
set(EMBROPE_SANITIZE "" CACHE STRING
    "Sanitizers for host code, e.g. address,undefined or thread (empty: none)")
option(EMBROPE_WERROR "Treat warnings in embrope's own code as errors" ON)
option(EMBROPE_BUILD_FUZZERS
       "Build the libFuzzer target fuzz/ (clang; CPU only; adds ASan and UBSan to the build)" OFF)

# The fuzz build instruments every source for coverage (fuzzer-no-link; the fuzz executable
# links the libFuzzer runtime) and runs it under AddressSanitizer + UndefinedBehaviorSanitizer.
if(EMBROPE_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "EMBROPE_BUILD_FUZZERS needs clang (-DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang), not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(NOT EMBROPE_SANITIZE)
    set(EMBROPE_SANITIZE "address,undefined")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()

# -Wall -Wextra (and -Werror) for a target of embrope's own, for C++ and CUDA sources alike.
function(embrope_warnings target)
  set(cxx -Wall -Wextra)
  set(cuda -Xcompiler=-Wall,-Wextra)
  if(EMBROPE_WERROR)
    list(APPEND cxx -Werror)
    list(APPEND cuda -Werror=all-warnings -Xcompiler=-Werror)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${cxx}>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra $<$<BOOL:${EMBROPE_WERROR}>:-Werror>>
    $<$<COMPILE_LANGUAGE:CUDA>:${cuda}>)
endfunction()

if(EMBROPE_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${EMBROPE_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>)
  # GCC's -Wmaybe-uninitialized misfires inside libstdc++ (std::function in <regex>) when
  # sanitizers change inlining; it is not a finding about embrope.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-Wno-maybe-uninitialized>)
  endif()
  # Clang cannot vectorize `omp simd` loops once sanitizer checks are inside them, and says
  # so as a warning; the instrumented build is for finding bugs, not for speed.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-Wno-pass-failed>)
  endif()
  add_link_options(-fsanitize=${EMBROPE_SANITIZE})
endif()
