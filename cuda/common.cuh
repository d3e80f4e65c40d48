// Shared pieces of the CUDA backend: error checks, the current-device guard, launch shapes.
// The device side of bad-index reporting is in bad_index.cuh, vector accesses in vector.cuh,
// workspaces in workspace.cuh.
#pragma once

#include <cuda_runtime.h>

#include <string>

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

// The current device's multiprocessor count, queried once per device (decode-sized calls
// are launch-bound, so their host path stays short).
int multiprocessor_count();

// Grid size for a grid-stride loop over `work` items of `per_block` each.
inline unsigned grid_for(std::int64_t work, std::int64_t per_block, unsigned cap = 65535u * 8u) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

}  // namespace embrope::gpu
