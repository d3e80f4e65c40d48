// Portability macros for code shared by the CPU and CUDA backends.
#pragma once

#if defined(__CUDACC__)
#define EMBROPE_HD __host__ __device__ __forceinline__
#else
#define EMBROPE_HD inline
#endif
