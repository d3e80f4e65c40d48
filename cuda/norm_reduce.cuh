// The GPU's half of the canonical row sum of detail/norm_math.hpp, used by every normalising
// kernel. The halving partial[m] += partial[m + h], h = 128, ..., 1, is a tree whose node after
// step h = 32 at m < 32 is the halving sum of the eight leaves m + 32 k (subtree_sum: the steps
// h = 128, 64, 32 restricted to them); the steps h = 16, ..., 1 then combine the 32 nodes. Two
// ways in:
// - reduce_norm_partials: lane l holds partials 8 l .. 8 l + 7 (the layout of 16-byte loads);
//   the leaves go through shared memory, lane l computes node l, and every lane combines the
//   nodes: two block barriers.
// - sum_norm_nodes: lane l already holds partials l + 32 k (a row's elements strided by 32) and
//   computes node l itself: one barrier.
// Every lane combines the 32 nodes in the same order, so all get the CPU's bits.
#pragma once

#include <cuda_runtime.h>

#include "block_shared.cuh"
#include "embrope/detail/norm_math.hpp"

namespace embrope::gpu {

constexpr int kNormNodes = detail::kNormLanes;  // nodes of a row: one per lane
constexpr int kLeavesPerNode = detail::kNormPartials / kNormNodes;
static_assert(kNormNodes == 32 && kLeavesPerNode == 8, "the tree's levels named above");

// The halving sum of v[0 .. 2 kHalf) (kHalf a power of two): v[m] += v[m + h] for h = kHalf,
// kHalf / 2, ..., 1. Recursion rather than a loop over h, so that every index is a constant and
// v stays in registers.
template <int kHalf>
__device__ __forceinline__ float subtree_sum(float* v) {
#pragma unroll
  for (int m = 0; m < kHalf; ++m) v[m] += v[m + kHalf];
  if constexpr (kHalf > 1) {
    return subtree_sum<kHalf / 2>(v);
  } else {
    return v[0];
  }
}

// The row's sum from its 32 nodes (this lane's node `node`), through `nodes`: the row's 32
// floats of shared memory, which every lane of the row reads after the barrier. It has a
// barrier: every thread of the block calls it, the same number of times (a slot without a row
// passes zero). A caller that calls it again before another barrier passes the other of two
// buffers (a lane may still be reading this one).
__device__ __forceinline__ float sum_norm_nodes(float node, float* nodes, int lane) {
  nodes[lane] = node;
  __syncthreads();
  float top[kNormNodes];
#pragma unroll
  for (int m = 0; m < kNormNodes; ++m) top[m] = nodes[m];
  return subtree_sum<kNormNodes / 2>(top);
}

// The sum of the row in slot `slot` of the block (threadIdx.y), given this lane's partials
// 8 lane + w. It has two barriers: every thread of the block calls it, the same number of
// times (a slot without a row passes zeros). The leaves and the nodes live in separate arrays,
// so the next call needs no barrier of its own before writing: its leaves are written after
// every lane has read this call's (before its second barrier), its nodes after its own first
// barrier, by which every lane has read this call's nodes.
__device__ __forceinline__ float reduce_norm_partials(const float* part, int slot, int lane) {
  constexpr int kWidth = detail::kNormLaneWidth;
  float* const leaves = block_shared().norm_scratch + slot * detail::kNormPartials;
  float* const nodes =
      block_shared().norm_scratch + kNormBlockRows * detail::kNormPartials + slot * kNormNodes;
#pragma unroll
  for (int w = 0; w < kWidth; ++w) leaves[lane * kWidth + w] = part[w];
  __syncthreads();
  float node[kLeavesPerNode];
#pragma unroll
  for (int k = 0; k < kLeavesPerNode; ++k) node[k] = leaves[lane + kNormNodes * k];
  return sum_norm_nodes(subtree_sum<kLeavesPerNode / 2>(node), nodes, lane);
}

}  // namespace embrope::gpu
