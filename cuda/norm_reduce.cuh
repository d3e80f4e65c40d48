// The GPU's half of the canonical row sum of detail/norm_math.hpp: a row's 32 lanes each hold
// kNormLaneWidth running partials (lane l: partials 8 l .. 8 l + 7), which are combined by
// halving in the block's shared memory, the CPU's order. Used by every normalising kernel.
#pragma once

#include <cuda_runtime.h>

#include "block_shared.cuh"
#include "embrope/detail/norm_math.hpp"

namespace embrope::gpu {

// The sum of the row in slot `slot` of the block (threadIdx.y), given this lane's partials.
// It has barriers: every thread of the block calls it, the same number of times (a slot
// without a row passes zeros).
__device__ __forceinline__ float reduce_norm_partials(const float* part, int slot, int lane) {
  constexpr int kLanes = detail::kNormLanes;
  constexpr int kWidth = detail::kNormLaneWidth;
  float* const s = block_shared().norm_partials + slot * detail::kNormPartials;
#pragma unroll
  for (int w = 0; w < kWidth; ++w) s[lane * kWidth + w] = part[w];
  __syncthreads();
  for (int h = detail::kNormPartials / 2; h >= 1; h /= 2) {
    for (int m = lane; m < h; m += kLanes) s[m] += s[m + h];
    __syncthreads();
  }
  const float total = s[0];
  __syncthreads();  // read by every lane before the next reduction writes
  return total;
}

}  // namespace embrope::gpu
