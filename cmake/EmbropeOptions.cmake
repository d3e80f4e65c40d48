# Build options of embrope, and embrope_target_defaults(), which every target of the project
# calls: nothing here changes the flags of a parent project that adds embrope as a
# subdirectory.
set(EMBROPE_CUDA AUTO CACHE STRING "Build the CUDA kernels: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE EMBROPE_CUDA PROPERTY STRINGS AUTO ON OFF)
option(EMBROPE_BUILD_TESTS "Build the tests" ${PROJECT_IS_TOP_LEVEL})
option(EMBROPE_BUILD_BENCHMARKS "Build the benchmark executable" ${PROJECT_IS_TOP_LEVEL})
option(EMBROPE_BUILD_EXAMPLES "Build the examples" ${PROJECT_IS_TOP_LEVEL})
# The ONNX RotaryEmbedding test vectors (test_rotary_embedding.json). Empty: their tests
# report skipped.
set(EMBROPE_CONFORMANCE_DIR "" CACHE PATH
    "Directory of the ONNX RotaryEmbedding conformance vectors (empty: their tests skip)")
option(EMBROPE_REQUIRE_CONFORMANCE "Fail to configure when the ONNX vectors are missing" OFF)
set(EMBROPE_SANITIZE "" CACHE STRING
    "Sanitizers for the project's host code, e.g. address,undefined or thread (empty: none)")
# The Python extension (python/, nanobind); pip install . turns it on (pyproject.toml).
option(EMBROPE_BUILD_PYTHON "Build the Python extension module (needs nanobind)" OFF)
option(EMBROPE_WERROR "Treat warnings in embrope's own code as errors" ${PROJECT_IS_TOP_LEVEL})
option(EMBROPE_BUILD_FUZZERS
       "Build the libFuzzer target fuzz/ (clang; CPU only; adds ASan and UBSan to the build)" OFF)

if(EMBROPE_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "EMBROPE_BUILD_FUZZERS needs clang (-DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang), not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(NOT EMBROPE_SANITIZE)
    set(EMBROPE_SANITIZE "address,undefined")
  endif()
endif()

# What every target of embrope's own gets:
# - -Wall -Wextra (and -Werror with EMBROPE_WERROR) for C, C++ and CUDA sources. (Spills and
#   local memory of the kernels are checked on the built library by
#   scripts/check-cuda-binary.sh: CUB's own kernels spill, so ptxas cannot be made to fail on
#   them build-wide.)
# - EMBROPE_SANITIZE's sanitizers on host code (compile and link);
# - with EMBROPE_BUILD_FUZZERS, libFuzzer's coverage instrumentation (the fuzz executable
#   links the libFuzzer runtime itself).
function(embrope_target_defaults target)
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
  if(EMBROPE_SANITIZE)
    set(san -fsanitize=${EMBROPE_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    # GCC's -Wmaybe-uninitialized misfires inside libstdc++ (std::function in <regex>) when
    # sanitizers change inlining; it is not a finding about embrope.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      list(APPEND san -Wno-maybe-uninitialized)
    endif()
    # Clang cannot vectorize `omp simd` loops once sanitizer checks are inside them, and says
    # so as a warning; the instrumented build is for finding bugs, not for speed.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      list(APPEND san -Wno-pass-failed)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:${san}>)
    target_link_options(${target} PRIVATE -fsanitize=${EMBROPE_SANITIZE})
  endif()
  if(EMBROPE_BUILD_FUZZERS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
  endif()
endfunction()
