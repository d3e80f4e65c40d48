// Positions of a packed variable-length batch on the GPU, without a host round trip
// (the varlen layout of FlashAttention and TransformerEngine's fused RoPE with cu_seqlens):
//  1. check_and_mark: one thread per cu_seqlens entry checks it (non-decreasing from 0 to T)
//     and marks the first token of each non-empty sequence b with b;
//  2. cub::DeviceScan::InclusiveScan with maximum spreads each mark over its sequence, so
//     sequence_of[t] is the sequence holding token t (two-phase temporary storage);
//  3. write_positions: one thread per sequence checks its start offset, one thread per token
//     writes start_offsets[b] + (t - cu_seqlens[b]).
// Work and grids are proportional to T + B, never to B x max_len.
#include <cuda/functional>
#include <cub/device/device_scan.cuh>

#include <cstdint>

#include "../src/backend.hpp"
#include "common.cuh"

namespace embrope::cuda {
namespace {

constexpr int kThreads = 256;

__device__ std::int64_t cu_at(const detail::PackedPositionsParams& p, std::int64_t b) {
  return detail::load_index(p.cu_seqlens, p.cu_dtype, b * p.cu_stride);
}

__device__ std::int64_t start_at(const detail::PackedPositionsParams& p, std::int64_t b) {
  return p.start_offsets == nullptr
             ? 0
             : detail::load_index(p.start_offsets, p.start_dtype, b * p.start_stride);
}

// Run by one thread of the last block of each kernel: if the record's key names an entry of
// this call that is bad, write its value and valid range.
__device__ void describe(const detail::PackedPositionsParams& p) {
  const std::int64_t key = current_key(p.bad);
  if (key == detail::kNoBadIndex) return;
  const std::int64_t b = key / 8;
  const auto arg = static_cast<detail::BadIndexArg>(key % 8);
  if (arg == detail::BadIndexArg::cu_seqlens && b <= p.sequences) {
    std::int64_t lower = 0, upper = 0;
    detail::cu_seqlens_range(p, b, b > 0 ? cu_at(p, b - 1) : 0, &lower, &upper);
    const std::int64_t value = cu_at(p, b);
    if (value < lower || value >= upper) {
      p.bad->value = value;
      p.bad->lower = lower;
      p.bad->upper = upper;
      p.bad->op = static_cast<std::int32_t>(detail::BadIndexOp::packed_positions);
    }
  } else if (arg == detail::BadIndexArg::start_offsets && b < p.sequences) {
    const std::int64_t length = cu_at(p, b + 1) - cu_at(p, b);
    const std::int64_t value = start_at(p, b);
    if (value < 0 || value > detail::max_start_offset(p, length)) {
      p.bad->value = value;
      p.bad->lower = 0;
      p.bad->upper = detail::start_offset_upper(p, length);
      p.bad->op = static_cast<std::int32_t>(detail::BadIndexOp::packed_positions);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    check_and_mark(const __grid_constant__ detail::PackedPositionsParams p, int* marks,
                   int* invalid) {
  for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x;
       b <= p.sequences; b += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const std::int64_t value = cu_at(p, b);
    std::int64_t lower = 0, upper = 0;
    detail::cu_seqlens_range(p, b, b > 0 ? cu_at(p, b - 1) : 0, &lower, &upper);
    if (value < lower || value >= upper) {
      *invalid = 1;
      report_bad_row(p.bad, detail::bad_index_key(b, detail::BadIndexArg::cu_seqlens));
    } else if (b < p.sequences && value >= 0 && value < p.tokens && value < cu_at(p, b + 1)) {
      // The first token of a non-empty sequence (distinct for distinct b when cu_seqlens is
      // valid). An entry after a bad one is checked against that bad value, so it may pass
      // while holding anything: the bounds on value keep the store inside marks regardless.
      marks[value] = static_cast<int>(b);
    }
  }
  if (last_block_done(p.bad)) describe(p);
}

__device__ bool start_is_valid(const detail::PackedPositionsParams& p, std::int64_t b,
                               std::int64_t start) {
  return start >= 0 && start <= detail::max_start_offset(p, cu_at(p, b + 1) - cu_at(p, b));
}

// Runs once cu_seqlens is known to be valid or not. Start offsets are checked per sequence,
// empty sequences included (as on the CPU), and only when cu_seqlens is valid (the CPU reports
// a bad cu_seqlens alone). Tokens of a sequence with a bad start, and all tokens when
// cu_seqlens is bad, get position -1.
__global__ void __launch_bounds__(kThreads)
    write_positions(const __grid_constant__ detail::PackedPositionsParams p, const int* sequence_of,
                    const int* invalid) {
  const bool all_invalid = *invalid != 0;
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kThreads;
  if (!all_invalid && p.start_offsets != nullptr) {
    for (std::int64_t b = first; b < p.sequences; b += step) {
      if (!start_is_valid(p, b, start_at(p, b))) {
        report_bad_row(p.bad, detail::bad_index_key(b, detail::BadIndexArg::start_offsets));
      }
    }
  }
  for (std::int64_t t = first; t < p.tokens; t += step) {
    std::int64_t position = -1;
    if (!all_invalid) {
      const std::int64_t b = sequence_of[t];
      const std::int64_t start = start_at(p, b);
      if (start_is_valid(p, b, start)) position = start + (t - cu_at(p, b));
    }
    detail::store_index(p.positions, p.position_dtype, t * p.position_stride, position);
  }
  if (last_block_done(p.bad)) describe(p);
}

}  // namespace

void packed_positions(const detail::PackedPositionsParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = to_cuda(stream);
  const std::int64_t tokens = p.tokens;
  const auto* no_input = static_cast<const int*>(nullptr);
  // Phase one of CUB's two-phase call: how much temporary storage the scan needs.
  std::size_t scan_bytes = 0;
  check(cub::DeviceScan::InclusiveScan(nullptr, scan_bytes, no_input, static_cast<int*>(nullptr),
                                       ::cuda::maximum<>{}, tokens, s),
        "cub::DeviceScan::InclusiveScan (size query)");
  // One allocation: the invalid flag, marks [T], sequence_of [T], then CUB's storage.
  const std::size_t ints = 2 * static_cast<std::size_t>(tokens) + 4;  // 4: keeps 16-byte alignment
  const std::size_t bytes = ints * sizeof(int) + scan_bytes;
  void* workspace = nullptr;
  check(cudaMallocAsync(&workspace, bytes, s), "cudaMallocAsync (packed_positions workspace)");
  int* invalid = static_cast<int*>(workspace);
  int* marks = invalid + 4;
  int* sequence_of = marks + tokens;
  void* scan_storage = sequence_of + tokens;
  try {
    // The flag and the marks start at 0; sequence_of is written whole by the scan.
    check(cudaMemsetAsync(workspace, 0, (4 + static_cast<std::size_t>(tokens)) * sizeof(int), s),
          "cudaMemsetAsync");
    check_and_mark<<<grid_for(p.sequences + 1, kThreads), kThreads, 0, s>>>(p, marks, invalid);
    check_launch("check_and_mark");
    if (tokens > 0) {
      check(cub::DeviceScan::InclusiveScan(scan_storage, scan_bytes, marks, sequence_of,
                                           ::cuda::maximum<>{}, tokens, s),
            "cub::DeviceScan::InclusiveScan");
    }
    // With no tokens, the start offsets of the (empty) sequences are still checked.
    const std::int64_t items =
        p.start_offsets != nullptr && p.sequences > tokens ? p.sequences : tokens;
    if (items > 0) {
      write_positions<<<grid_for(items, kThreads), kThreads, 0, s>>>(p, sequence_of, invalid);
      check_launch("write_positions");
    }
  } catch (...) {
    cudaFreeAsync(workspace, s);
    throw;
  }
  check(cudaFreeAsync(workspace, s), "cudaFreeAsync (packed_positions workspace)");
}

}  // namespace embrope::cuda
