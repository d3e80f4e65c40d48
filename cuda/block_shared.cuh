// The statically allocated shared memory of a block, in one place: one __shared__ object
// whose fields are the pieces each kernel family uses, so that the device code declares
// shared memory exactly once. Every kernel that touches it (through last_block_done, which
// nearly all do) is given its full size, about 2.3 KB: below what limits the occupancy of
// any kernel here.
#pragma once

#include <cuda_runtime.h>

#include "embrope/detail/norm_math.hpp"

namespace embrope::gpu {

// Rows of a block of embed_norm_kernel (32 lanes each).
constexpr int kNormBlockRows = 2;

struct BlockShared {
  // The norm reductions' scratch (norm_reduce.cuh): the leaves, then the nodes, of
  // kNormBlockRows rows; or two buffers of nodes for up to 8 rows (qk_norm_rope_neox_kernel).
  // 16-byte aligned: the nodes are read as vectors.
  alignas(16) float norm_scratch[kNormBlockRows * (detail::kNormPartials + detail::kNormLanes)];
  bool describe;  // last_block_done's verdict
};

__device__ __forceinline__ BlockShared& block_shared() {
  __shared__ BlockShared shared;
  return shared;
}

}  // namespace embrope::gpu
