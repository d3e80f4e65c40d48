// The device side of bad-index reporting (src/bad_index.hpp holds the record, its key
// encoding and the host policy; docs/errors.md the contract).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../src/bad_index.hpp"
#include "../src/apply_rope_params.hpp"
#include "block_shared.cuh"

namespace embrope::gpu {

// Bad-index protocol. A thread that meets a bad row lowers record->key with an atomic min
// (and flags the record when it did lower it). When a block is done, one of its threads takes
// a ticket; the last block of the grid then, if this launch lowered the key, re-resolves the
// row named by the key and writes its value and range (so that value and key always describe
// the same row, whatever the order in which blocks ran). A key left by an earlier call on the
// same DeferredStatus stays described as that call described it, as on the CPU.
__device__ __forceinline__ void report_bad_row(internal::BadIndexRecord* record, std::int64_t key) {
  const long long old = atomicMin(&record->key, static_cast<long long>(key));
  if (key < old) atomicExch(&record->lowered, 1);
}

// The key as the other blocks left it (a volatile load: not served from this SM's L1).
__device__ __forceinline__ std::int64_t current_key(const internal::BadIndexRecord* record) {
  return *static_cast<const volatile long long*>(&record->key);
}

// Call with all threads of the block after their last report_bad_row. Returns true in one
// thread of the last block to finish, when this launch lowered the key; that thread then
// describes the record (describe_bad_index). Resets the per-launch fields for the next
// launch.
__device__ __forceinline__ bool last_block_done(internal::BadIndexRecord* record) {
  bool& describe = block_shared().describe;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    const unsigned total = gridDim.x * gridDim.y * gridDim.z;
    const unsigned ticket = atomicAdd(&record->finished_blocks, 1u);
    describe = false;
    if (ticket == total - 1) {
      __threadfence();
      record->finished_blocks = 0;
      describe = atomicExch(&record->lowered, 0) != 0;
    }
  }
  __syncthreads();
  return describe && threadIdx.x == 0 && threadIdx.y == 0;
}

// Run by one thread of the last block of a RoPE-family launch: if the record's key names a
// token of this call whose position is out of range, write that position and the range.
__device__ inline void describe_bad_rope_position(const internal::RopeParams& p) {
  const std::int64_t key = current_key(p.bad);
  const std::int64_t t = internal::bad_index_row(key);
  if (key == internal::kNoBadIndex || t >= p.batch * p.seq ||
      internal::bad_index_arg(key) != internal::BadIndexArg::positions) {
    return;
  }
  const std::int64_t b = t / p.seq;
  if (internal::rope_bad_stream(p, b, t - b * p.seq) >= 0) {
    internal::describe_bad_index(p.bad, p.bad_op, internal::rope_bad_position(p, t));
  }
}

}  // namespace embrope::gpu
