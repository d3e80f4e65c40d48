// Building the cos/sin table on the GPU: one thread per (position, frequency), float64
// angles through detail::rope_cos_sin, the same function the CPU build uses, so host and
// device tables agree up to the float64 sin/cos of the two libms (both well under a float32
// ulp before the final rounding).
#include "../src/backend.hpp"
#include "common.cuh"
#include "embrope/detail/rope_math.hpp"

namespace embrope::gpu {
namespace {

__global__ void build_rope_cache_kernel(float* table, std::int64_t max_positions,
                                        std::int64_t rotary_dim, const double* inv_freq,
                                        double attention_factor) {
  const std::int64_t half = rotary_dim / 2;
  const std::int64_t total = max_positions * half;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = e / half;
    const std::int64_t i = e - p * half;
    float* row = table + p * rotary_dim;
    detail::rope_cos_sin(p, inv_freq[i], attention_factor, &row[i], &row[half + i]);
  }
}

}  // namespace

void build_rope_cache(float* table, std::int64_t max_positions, std::int64_t rotary_dim,
                      const double* inv_freq, double attention_factor, Device device,
                      Stream stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = to_cuda(stream);
  const std::size_t bytes = static_cast<std::size_t>(rotary_dim / 2) * sizeof(double);
  double* freqs = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&freqs), bytes, s), "cudaMallocAsync");
  constexpr int threads = 256;
  try {
    check(cudaMemcpyAsync(freqs, inv_freq, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    build_rope_cache_kernel<<<grid_for(max_positions * (rotary_dim / 2), threads, threads), threads,
                              0, s>>>(table, max_positions, rotary_dim, freqs, attention_factor);
    check_launch("build_rope_cache_kernel");
  } catch (...) {
    if (cudaFreeAsync(freqs, s) != cudaSuccess) (void)cudaGetLastError();
    throw;
  }
  check(cudaFreeAsync(freqs, s), "cudaFreeAsync");
}

}  // namespace embrope::gpu
