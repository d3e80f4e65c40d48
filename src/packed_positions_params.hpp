// packed_positions' parameters and the accessors of its cu_seqlens and start_offsets entries
// (apply_rope_params.hpp says how parameters are made and used).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bad_index.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/types.hpp"
#include "tensor_access.hpp"

namespace embrope::internal {

struct PackedPositionsParams {
  const void* cu_seqlens = nullptr;  // [B + 1]
  DType cu_dtype = DType::int64;
  std::int64_t cu_stride = 1;
  std::int64_t sequences = 0;           // B
  const void* start_offsets = nullptr;  // [B] or null
  DType start_dtype = DType::int64;
  std::int64_t start_stride = 0;
  void* positions = nullptr;  // [T]
  DType position_dtype = DType::int64;
  std::int64_t position_stride = 1;
  std::int64_t tokens = 0;  // T
  BadIndexRecord* bad = nullptr;
  void* workspace = nullptr;  // CUDA: the caller's workspace; null: allocate on the stream
  std::size_t workspace_bytes = 0;
};

// packed_positions: entry b of cu_seqlens and of start_offsets (0 when absent).
EMBROPE_HD std::int64_t cu_seqlens_at(const PackedPositionsParams& p, std::int64_t b) {
  return load_index(p.cu_seqlens, p.cu_dtype, b * p.cu_stride);
}
EMBROPE_HD std::int64_t start_offset_at(const PackedPositionsParams& p, std::int64_t b) {
  return p.start_offsets == nullptr
             ? 0
             : load_index(p.start_offsets, p.start_dtype, b * p.start_stride);
}

// cu_seqlens[b] and the range [lower, upper) it must lie in, given the entry before it (0 for
// b = 0): entry 0 is 0, entry B is T, the others lie in [previous, T].
EMBROPE_HD BadIndexValue cu_seqlens_entry(const PackedPositionsParams& p, std::int64_t b,
                                          std::int64_t previous) {
  BadIndexValue v{cu_seqlens_at(p, b), b == 0 ? 0 : previous, b == 0 ? 1 : p.tokens + 1};
  if (b == p.sequences) {  // the last entry is T (for B = 0 the only entry is both 0 and T)
    v.lower = v.lower > p.tokens ? v.lower : p.tokens;
    v.upper = v.upper < p.tokens + 1 ? v.upper : p.tokens + 1;
  }
  return v;
}
EMBROPE_HD bool entry_in_range(const BadIndexValue& v) {
  return v.value >= v.lower && v.value < v.upper;
}

// The largest start offset that keeps a sequence of `length` tokens representable.
EMBROPE_HD std::int64_t max_start_offset(const PackedPositionsParams& p, std::int64_t length) {
  const std::int64_t top = p.position_dtype == DType::int32 ? INT32_MAX : INT64_MAX;
  return length == 0 ? top : top - (length - 1);
}

// Sequence b's start offset, valid when in [0, max_start_offset]; its range as a record says
// it is [0, max_start_offset + 1), saturated at INT64_MAX.
EMBROPE_HD std::int64_t sequence_length(const PackedPositionsParams& p, std::int64_t b) {
  return cu_seqlens_at(p, b + 1) - cu_seqlens_at(p, b);
}
EMBROPE_HD bool start_offset_valid(const PackedPositionsParams& p, std::int64_t b,
                                   std::int64_t start) {
  return start >= 0 && start <= max_start_offset(p, sequence_length(p, b));
}
EMBROPE_HD BadIndexValue start_offset_entry(const PackedPositionsParams& p, std::int64_t b) {
  const std::int64_t m = max_start_offset(p, sequence_length(p, b));
  return {start_offset_at(p, b), 0, m == INT64_MAX ? INT64_MAX : m + 1};
}

}  // namespace embrope::internal
