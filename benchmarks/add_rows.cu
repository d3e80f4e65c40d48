// The add pass of the benchmark's unfused embedding baseline on the GPU: out += tmp, 16 bytes
// per thread and step (the baseline should be a fair, memory-speed second pass).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "add_rows.hpp"

namespace {

template <typename T>
__global__ void add_kernel(T* out, const T* tmp, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = static_cast<T>(static_cast<float>(out[i]) + static_cast<float>(tmp[i]));
  }
}

// Eight bf16/f16 or four f32 values per 16-byte step.
template <typename T>
__global__ void add_vector_kernel(uint4* out, const uint4* tmp, std::int64_t n_vectors) {
  constexpr int kPer = 16 / sizeof(T);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < n_vectors; i += stride) {
    uint4 a = out[i];
    const uint4 b = tmp[i];
    T* av = reinterpret_cast<T*>(&a);
    const T* bv = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      av[j] = static_cast<T>(static_cast<float>(av[j]) + static_cast<float>(bv[j]));
    out[i] = a;
  }
}

template <typename T>
void launch(void* out, const void* tmp, std::int64_t n, cudaStream_t stream) {
  constexpr int kPer = 16 / sizeof(T);
  if (n % kPer == 0) {
    const std::int64_t vectors = n / kPer;
    const int blocks =
        static_cast<int>(vectors / 256 + 1 < 65535 * 8 ? vectors / 256 + 1 : 65535 * 8);
    add_vector_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<uint4*>(out),
                                                     static_cast<const uint4*>(tmp), vectors);
  } else {
    const int blocks = static_cast<int>(n / 256 + 1 < 65535 * 8 ? n / 256 + 1 : 65535 * 8);
    add_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(tmp), n);
  }
}

}  // namespace

void bench_add_rows(void* out, const void* tmp, std::int64_t n, int element_bytes, bool bf16,
                    void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (element_bytes == 4) {
    launch<float>(out, tmp, n, s);
  } else if (bf16) {
    launch<__nv_bfloat16>(out, tmp, n, s);
  } else {
    launch<__half>(out, tmp, n, s);
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("bench_add_rows: launch failed: ") +
                             cudaGetErrorString(status));
  }
}
