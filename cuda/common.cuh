// Shared pieces of the CUDA backend: error checks, the current-device guard, launch shapes.
// The device side of bad-index reporting is in bad_index.cuh, vector accesses in vector.cuh,
// workspaces in workspace.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
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

// The current device's multiprocessor count, and the blocks of `threads_per_block` threads one
// multiprocessor holds at once by its thread and block limits (2048 threads and 32 blocks on
// sm_80 and sm_90; registers may allow fewer), queried once per device (decode-sized calls are
// launch-bound, so their host path stays short).
int multiprocessor_count();
std::int64_t blocks_per_multiprocessor(std::int64_t threads_per_block);

// Every launch walks its work with grid-stride loops, so a grid needs only enough blocks to keep
// the device full: at most kGridWaves times what it holds at once. More blocks cost more than
// they give: every block, when it ends, fences its writes and takes a ticket from the launch's
// bad-index record (last_block_done: an atomic on one word that all blocks share), so a block
// that does little work spends most of its life there. Measured on an H200: qk-norm + RoPE with
// one 64-thread block per 2 rows (327,680 blocks at 16,384 tokens of Qwen3-8B) ran at 11% of a
// device copy (benchmarks/results/gpu-2026-11-27-h200-f1b98a5).
constexpr std::int64_t kGridWaves = 4;

// Grid size for a grid-stride loop over `work` items, `per_block` of them per block of
// `threads_per_block` threads.
inline unsigned grid_for(std::int64_t work, std::int64_t per_block,
                         std::int64_t threads_per_block) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  const std::int64_t cap =
      kGridWaves * multiprocessor_count() * blocks_per_multiprocessor(threads_per_block);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

}  // namespace embrope::gpu
