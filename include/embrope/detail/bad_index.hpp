// The record a kernel leaves when it meets an id or position outside its table.
#pragma once

#include <cstdint>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

// Which op and which argument a record is about; used to word the error message.
enum class BadIndexOp : std::int32_t {
  embed = 1,
  apply_rope = 2,
  packed_positions = 3,
  embed_backward = 4,
  apply_rope_backward = 5,
};
enum class BadIndexArg : std::int32_t {
  ids = 0,                // embed: a token id outside the vocabulary (or shard)
  position_ids = 1,       // embed: an explicit position outside the position table
  implicit_position = 2,  // embed: offset + s outside the position table
  type_ids = 3,           // embed: a token-type id outside the type table
  positions = 0 + 4,      // apply_rope: a position outside the cos/sin table
  cu_seqlens = 5,         // packed_positions: not non-decreasing from 0 to the token count
  start_offsets = 6,      // packed_positions: a start that makes positions unrepresentable
};

constexpr std::int64_t kNoBadIndex = INT64_MAX;

// key = row * 8 + arg orders reports by row, then by argument, so that the smallest key is
// "the first offending row" whatever order threads ran in (an atomic min on the GPU).
struct BadIndexRecord {
  std::int64_t key = kNoBadIndex;
  std::int64_t value = 0;  // the offending id or position, as given
  std::int64_t lower = 0;  // the valid range is [lower, upper)
  std::int64_t upper = 0;
  std::int32_t op = 0;
  // Used by the CUDA kernels during a launch, zero between launches: the blocks finished so
  // far, and whether this launch lowered the key (a DeferredStatus may hold an earlier call's
  // report, which a later call must not re-describe).
  std::int32_t finished_blocks = 0;
  std::int32_t lowered = 0;
  std::int32_t padding = 0;
};

EMBROPE_HD constexpr std::int64_t bad_index_key(std::int64_t row, BadIndexArg arg) {
  return row * 8 + static_cast<std::int64_t>(arg);
}

}  // namespace embrope::detail
