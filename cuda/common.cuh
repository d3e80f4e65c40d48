// Shared pieces of the CUDA backend: error checks, the current-device guard, launch
// shapes, and the device side of the bad-index protocol (src/bad_index.hpp,
// docs/errors.md). Vector accesses are in vector.cuh, workspaces in workspace.cuh.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "../src/bad_index.hpp"
#include "embrope/error.hpp"
#include "embrope/types.hpp"

namespace embrope::gpu {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what);

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what);
}

inline cudaStream_t to_cuda(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

// Makes `device` current for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Checks the launch that has just been enqueued.
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

// Bad-index protocol. A thread that meets a bad row lowers record->key with an atomic min
// (and flags the record when it did lower it). When a block is done, one of its threads takes
// a ticket; the last block of the grid then, if this launch lowered the key, re-resolves the
// row named by the key and writes its value and range (so that value and key always describe
// the same row, whatever the order in which blocks ran). A key left by an earlier call on the
// same DeferredStatus stays described as that call described it, as on the CPU.
__device__ __forceinline__ void report_bad_row(detail::BadIndexRecord* record, std::int64_t key) {
  const long long old = atomicMin(&record->key, static_cast<long long>(key));
  if (key < old) atomicExch(&record->lowered, 1);
}

// The key as the other blocks left it (a volatile load: not served from this SM's L1).
__device__ __forceinline__ std::int64_t current_key(const detail::BadIndexRecord* record) {
  return *static_cast<const volatile long long*>(&record->key);
}

// Call with all threads of the block after their last report_bad_row. Returns true in one
// thread of the last block to finish, when this launch lowered the key; that thread then
// describes the record (describe_bad_index). Resets the per-launch fields for the next
// launch.
__device__ __forceinline__ bool last_block_done(detail::BadIndexRecord* record) {
  __shared__ bool describe;
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

// Grid size for a grid-stride loop over `work` items of `per_block` each.
inline unsigned grid_for(std::int64_t work, std::int64_t per_block, unsigned cap = 65535u * 8u) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

}  // namespace embrope::gpu
