// The statically allocated shared memory of a block, in one place: one __shared__ object
// whose fields are the pieces each kernel family uses, so that the device code declares
// shared memory exactly once. Every kernel that touches it (through last_block_done, which
// nearly all do) is given its full size, about 2 KB: below what limits the occupancy of
// any kernel here.
#pragma once

#include <cuda_runtime.h>

#include "embrope/detail/norm_math.hpp"

namespace embrope::gpu {

// Rows of a block of embed_norm_kernel (32 lanes each).
constexpr int kNormBlockRows = 2;

struct BlockShared {
  float norm_partials[kNormBlockRows * detail::kNormPartials];  // embed's norm reductions
  bool describe;                                                // last_block_done's verdict
};

__device__ __forceinline__ BlockShared& block_shared() {
  __shared__ BlockShared shared;
  return shared;
}

}  // namespace embrope::gpu
