// Which instruction set the CPU kernels use, chosen once per process: the widest the CPU has
// among AVX-512 with AVX512_BF16, AVX-512 (F, BW, VL, DQ), AVX2 with F16C, and the portable
// code, capped by the environment variable EMBROPE_CPU_ISA (portable, avx2, avx512 or
// avx512_bf16). Every choice gives the same bits (src/cpu/simd.hpp); only the speed differs.
// avx512_bf16 differs from avx512 only in its bfloat16 outputs: kernels of other dtypes run
// avx512's code under it (`isa >= Isa::avx512`).
#pragma once

#include "simd.hpp"

namespace embrope::cpu {

enum class Isa { portable, avx2, avx512, avx512_bf16 };  // in order of width

// Throws Error(invalid_argument) when EMBROPE_CPU_ISA names no instruction set.
Isa active_isa();
const char* isa_name(Isa isa);

}  // namespace embrope::cpu

// Opens and closes a region of a file whose functions are compiled for AVX2 (+F16C) or
// AVX-512: the x86 paths of a kernel are its vector body (a .inc file) included once in each
// region, inside a namespace of the same name, so that no function of one instruction set can
// stand in for another's (simd.hpp).
#if EMBROPE_CPU_X86
#if defined(__clang__)
#define EMBROPE_BEGIN_AVX2 \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,f16c\"))), apply_to = function)")
// (_Pragma takes one string literal: no concatenation.)
// clang-format off
#define EMBROPE_BEGIN_AVX512 _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c\"))), apply_to = function)")
#define EMBROPE_BEGIN_AVX512_BF16 _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c\"))), apply_to = function)")
// clang-format on
#define EMBROPE_END_TARGET _Pragma("clang attribute pop")
#else
// GCC 12's AVX-512 headers start vectors from a deliberately undefined value, which
// -Wmaybe-uninitialized (and -Wuninitialized, for the lane shuffles) reports once inlined:
// not a finding about embrope.
#define EMBROPE_BEGIN_AVX2 \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,f16c\")") _Pragma("GCC diagnostic push")
#define EMBROPE_BEGIN_AVX512                                                  \
  _Pragma("GCC push_options")                                                 \
      _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c\")") \
          _Pragma("GCC diagnostic push")                                      \
              _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")     \
                  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define EMBROPE_BEGIN_AVX512_BF16                                                        \
  _Pragma("GCC push_options")                                                            \
      _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c\")") \
          _Pragma("GCC diagnostic push")                                                 \
              _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")                \
                  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define EMBROPE_END_TARGET _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif

// A function whose loops must stay scalar. GCC 12 turns a rotation's scalar loop (a c - b s,
// a s + b c) into vfmaddsub on AVX-512, a fused multiply-add whatever -ffp-contract says, which
// rounds differently from the portable path and the GPU. Clang keeps the separate roundings.
#if defined(__clang__)
#define EMBROPE_SCALAR_LOOPS
#else
#define EMBROPE_SCALAR_LOOPS __attribute__((optimize("no-tree-vectorize", "no-tree-slp-vectorize")))
#endif
#endif
