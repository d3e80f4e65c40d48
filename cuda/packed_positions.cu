// Positions of a packed variable-length batch on the GPU, without a host round trip
// (the varlen layout of FlashAttention and TransformerEngine's fused RoPE with cu_seqlens):
//  1. check_and_mark: one thread per cu_seqlens entry checks it (non-decreasing from 0 to T)
//     and marks the first token of each non-empty sequence b with b;
//  2. cub::DeviceScan::InclusiveScan with maximum spreads each mark over its sequence, so
//     sequence_of[t] is the sequence holding token t;
//  3. write_positions: one thread per sequence checks its start offset, one thread per token
//     writes start_offsets[b] + (t - cu_seqlens[b]).
// Work and grids are proportional to T + B, never to B x max_len. The flags, marks and the
// scan's temporary storage are one workspace (workspace.cuh): the caller's, or allocated on
// the stream.
#include <cuda/functional>
#include <cub/device/device_scan.cuh>

#include <cstdint>

#include "../src/backend.hpp"
#include "bad_index.cuh"
#include "common.cuh"
#include "workspace.cuh"

namespace embrope::gpu {
namespace {

constexpr int kThreads = 256;

// Run by one thread of the last block of each kernel: if the record's key names an entry of
// this call that is bad, write its value and valid range.
__device__ void describe(const internal::PackedPositionsParams& p) {
  const std::int64_t key = current_key(p.bad);
  if (key == internal::kNoBadIndex) return;
  const std::int64_t b = internal::bad_index_row(key);
  const internal::BadIndexArg arg = internal::bad_index_arg(key);
  constexpr auto op = internal::BadIndexOp::packed_positions;
  if (arg == internal::BadIndexArg::cu_seqlens && b <= p.sequences) {
    const internal::BadIndexValue entry =
        internal::cu_seqlens_entry(p, b, b > 0 ? internal::cu_seqlens_at(p, b - 1) : 0);
    if (!internal::entry_in_range(entry)) internal::describe_bad_index(p.bad, op, entry);
  } else if (arg == internal::BadIndexArg::start_offsets && b < p.sequences) {
    if (!internal::start_offset_valid(p, b, internal::start_offset_at(p, b))) {
      internal::describe_bad_index(p.bad, op, internal::start_offset_entry(p, b));
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    check_and_mark(const __grid_constant__ internal::PackedPositionsParams p, int* marks,
                   int* invalid) {
  for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x;
       b <= p.sequences; b += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const internal::BadIndexValue entry =
        internal::cu_seqlens_entry(p, b, b > 0 ? internal::cu_seqlens_at(p, b - 1) : 0);
    const std::int64_t value = entry.value;
    if (!internal::entry_in_range(entry)) {
      // Several threads may find a bad entry: plain stores of the same value from each would
      // still be a data race.
      atomicExch(invalid, 1);
      report_bad_row(p.bad, internal::bad_index_key(b, internal::BadIndexArg::cu_seqlens));
    } else if (b < p.sequences && value >= 0 && value < p.tokens &&
               value < internal::cu_seqlens_at(p, b + 1)) {
      // The first token of a non-empty sequence (distinct for distinct b when cu_seqlens is
      // valid). An entry after a bad one is checked against that bad value, so it may pass
      // while holding anything: the bounds on value keep the store inside marks regardless.
      marks[value] = static_cast<int>(b);
    }
  }
  if (last_block_done(p.bad)) describe(p);
}

// Runs once cu_seqlens is known to be valid or not. Start offsets are checked per sequence,
// empty sequences included (as on the CPU), and only when cu_seqlens is valid (the CPU reports
// a bad cu_seqlens alone). Tokens of a sequence with a bad start, and all tokens when
// cu_seqlens is bad, get position -1.
__global__ void __launch_bounds__(kThreads)
    write_positions(const __grid_constant__ internal::PackedPositionsParams p,
                    const int* sequence_of, const int* invalid) {
  const bool all_invalid = *invalid != 0;
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kThreads;
  if (!all_invalid && p.start_offsets != nullptr) {
    for (std::int64_t b = first; b < p.sequences; b += step) {
      if (!internal::start_offset_valid(p, b, internal::start_offset_at(p, b))) {
        report_bad_row(p.bad, internal::bad_index_key(b, internal::BadIndexArg::start_offsets));
      }
    }
  }
  for (std::int64_t t = first; t < p.tokens; t += step) {
    std::int64_t position = -1;
    if (!all_invalid) {
      const std::int64_t b = sequence_of[t];
      const std::int64_t start = internal::start_offset_at(p, b);
      if (internal::start_offset_valid(p, b, start)) {
        position = start + (t - internal::cu_seqlens_at(p, b));
      }
    }
    internal::store_index(p.positions, p.position_dtype, t * p.position_stride, position);
  }
  if (last_block_done(p.bad)) describe(p);
}

// The workspace: the invalid flag, marks [T] (both zeroed), sequence_of [T], CUB's storage.
struct Pieces {
  int* invalid = nullptr;
  int* marks = nullptr;
  int* sequence_of = nullptr;
  void* scan = nullptr;
  std::size_t scan_bytes = 0;
  std::size_t required_bytes = 0;
};

Pieces plan(const internal::PackedPositionsParams& p, char* base, cudaStream_t stream) {
  Pieces w;
  WorkspaceLayout layout(base);
  const auto tokens = static_cast<std::size_t>(p.tokens);
  w.invalid = layout.take<int>(1);
  w.marks = layout.take<int>(tokens);
  w.sequence_of = layout.take<int>(tokens);
  // Phase one of CUB's two-phase call: how much temporary storage the scan needs.
  check(cub::DeviceScan::InclusiveScan(nullptr, w.scan_bytes, w.marks, w.sequence_of,
                                       ::cuda::maximum<>{}, p.tokens, stream),
        "cub::DeviceScan::InclusiveScan (size query)");
  w.scan = layout.take_bytes(w.scan_bytes);
  w.required_bytes = layout.required_bytes();
  return w;
}

}  // namespace

void packed_positions(const internal::PackedPositionsParams& p, Device device, Stream stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = to_cuda(stream);
  const Workspace workspace(p.workspace, plan(p, nullptr, s).required_bytes, s, "packed_positions");
  const Pieces w = plan(p, workspace.base(), s);
  const std::int64_t tokens = p.tokens;
  // The flag and the marks start at 0; sequence_of is written whole by the scan.
  check(cudaMemsetAsync(w.invalid, 0, sizeof(int), s), "cudaMemsetAsync");
  if (tokens > 0) {
    check(cudaMemsetAsync(w.marks, 0, static_cast<std::size_t>(tokens) * sizeof(int), s),
          "cudaMemsetAsync");
  }
  check_and_mark<<<grid_for(p.sequences + 1, kThreads, kThreads), kThreads, 0, s>>>(p, w.marks,
                                                                                    w.invalid);
  check_launch("check_and_mark");
  if (tokens > 0) {
    std::size_t bytes = w.scan_bytes;
    check(cub::DeviceScan::InclusiveScan(w.scan, bytes, w.marks, w.sequence_of, ::cuda::maximum<>{},
                                         tokens, s),
          "cub::DeviceScan::InclusiveScan");
  }
  // With no tokens, the start offsets of the (empty) sequences are still checked.
  const std::int64_t items =
      p.start_offsets != nullptr && p.sequences > tokens ? p.sequences : tokens;
  if (items > 0) {
    write_positions<<<grid_for(items, kThreads, kThreads), kThreads, 0, s>>>(p, w.sequence_of,
                                                                             w.invalid);
    check_launch("write_positions");
  }
}

std::size_t packed_positions_workspace_size(const internal::PackedPositionsParams& p,
                                            Device device) {
  DeviceGuard guard(device);
  return plan(p, nullptr, cudaStream_t{}).required_bytes;
}

}  // namespace embrope::gpu
