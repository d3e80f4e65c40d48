// Portability macros for code shared by the CPU and CUDA backends.
#pragma once

#if defined(__CUDACC__)
#define EMBROPE_HD __host__ __device__ __forceinline__
#else
#define EMBROPE_HD inline
#endif

// CPU helpers that the per-instruction-set vector bodies must compile as their own code
// (inlined, then vectorized for the caller's target) rather than call as one generic copy.
#if defined(__GNUC__)
#define EMBROPE_INLINE_INTO_CALLER inline __attribute__((always_inline))
#else
#define EMBROPE_INLINE_INTO_CALLER inline
#endif
