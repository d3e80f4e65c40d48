// Vector accesses of the CUDA kernels, in one place: a W-element chunk of T aligned to its
// size (one 16-byte load or store when W * sizeof(T) == 16), its loads as float32, and the
// host-side alignment test the launchers use to choose a vector path.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "embrope/detail/numeric_types.hpp"

namespace embrope::gpu {

// Elements of T in 16 bytes: the width of the fast paths' accesses.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

template <typename T, int W>
struct alignas(W * sizeof(T)) Chunk {
  T v[W];
};

// W consecutive elements at `src` (aligned to the chunk) as float32.
template <typename T, int W>
__device__ __forceinline__ void load_chunk(const T* src, float* dst) {
  const Chunk<T, W> c = *reinterpret_cast<const Chunk<T, W>*>(src);
#pragma unroll
  for (int w = 0; w < W; ++w) dst[w] = detail::to_float(c.v[w]);
}

// W elements at src into a chunk, and a chunk's W elements to dst: one aligned chunk access
// (kVector) or W scalar ones.
template <bool kVector, typename T, int W>
__device__ __forceinline__ void load_elements(const T* src, Chunk<T, W>& dst) {
  if constexpr (kVector) {
    dst = *reinterpret_cast<const Chunk<T, W>*>(src);
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) dst.v[w] = src[w];
  }
}
template <bool kVector, typename T, int W>
__device__ __forceinline__ void store_elements(T* dst, const Chunk<T, W>& src) {
  if constexpr (kVector) {
    *reinterpret_cast<Chunk<T, W>*>(dst) = src;
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) dst[w] = src.v[w];
  }
}

// N float32 values from an address aligned to min(N, 4) floats: float4 loads, or one float2.
template <int N>
__device__ __forceinline__ void load_floats(const float* src, float* dst) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + i);
      dst[i] = f.x;
      dst[i + 1] = f.y;
      dst[i + 2] = f.z;
      dst[i + 3] = f.w;
    }
  } else {
    static_assert(N == 2, "float chunks are 2 or a multiple of 4 floats");
    const float2 f = *reinterpret_cast<const float2*>(src);
    dst[0] = f.x;
    dst[1] = f.y;
  }
}

// Whether `pointer` is a multiple of `bytes` (null counts as aligned: an absent table).
inline bool is_aligned(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace embrope::gpu
