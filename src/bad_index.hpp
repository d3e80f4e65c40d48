// The one home of bad-index reporting (docs/errors.md, "Bad data"): the record a kernel
// leaves when it meets an id, position or cu_seqlens entry outside its valid range, its key
// encoding, the writing of what it describes, and the host-side policy that turns a record
// into an error or leaves it in the caller's DeferredStatus.
//
// Kernels of both backends use the record and its helpers; the CUDA-side protocol (atomic
// minimum, last block describes) is in cuda/bad_index.cuh.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "embrope/deferred_status.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

namespace embrope::internal {

// Which op a record is about; used to word the error message.
enum class BadIndexOp : std::int32_t {
  embed = 1,
  apply_rope = 2,
  packed_positions = 3,
  embed_backward = 4,
  apply_rope_backward = 5,
  apply_rope_append_kv = 6,
  apply_qk_norm_rope = 7,
  apply_qk_norm_rope_backward = 8,
  apply_qk_norm_rope_append_kv = 9,
};

// Which argument of the row was bad. A row may have several bad arguments; the lowest
// number is reported.
enum class BadIndexArg : std::int32_t {
  ids = 0,                // embed: a token id outside the vocabulary (or shard)
  position_ids = 1,       // embed: an explicit position outside the position table
  implicit_position = 2,  // embed: offset + s outside the position table
  type_ids = 3,           // embed: a token-type id outside the type table
  positions = 4,          // apply_rope: a position outside the cos/sin table
  cu_seqlens = 5,         // packed_positions: not non-decreasing from 0 to the token count
  start_offsets = 6,      // packed_positions: a start that makes positions unrepresentable
  slot_mapping = 7,       // apply_rope_append_kv: a slot outside the paged cache
  cache_offsets = 8,      // apply_rope_append_kv: a write position outside the contiguous cache
};
constexpr std::int64_t kBadIndexArgs = 16;  // the key's radix: room for every BadIndexArg

constexpr std::int64_t kNoBadIndex = INT64_MAX;

// key = row * kBadIndexArgs + arg orders reports by row, then by argument, so that the
// smallest key is "the first offending row" whatever order threads ran in (an atomic min on
// the GPU, a min-reduction on the CPU).
struct BadIndexRecord {
  // long long (64 bits, like std::int64_t): the type CUDA's atomicMin takes, so the GPU
  // lowers it without a pointer cast.
  long long key = kNoBadIndex;
  std::int64_t value = 0;  // the offending id or position, as given
  std::int64_t lower = 0;  // the valid range is [lower, upper)
  std::int64_t upper = 0;
  std::int32_t op = 0;  // a BadIndexOp
  // Used by the CUDA kernels during a launch, zero between launches: the blocks finished so
  // far, and whether this launch lowered the key (a DeferredStatus may hold an earlier call's
  // report, which a later call must not re-describe).
  std::uint32_t finished_blocks = 0;
  std::int32_t lowered = 0;
  std::int32_t padding = 0;
};
static_assert(sizeof(long long) == 8 && sizeof(BadIndexRecord) == 48, "one record layout");

EMBROPE_HD constexpr std::int64_t bad_index_key(std::int64_t row, BadIndexArg arg) {
  return row * kBadIndexArgs + static_cast<std::int64_t>(arg);
}
EMBROPE_HD constexpr std::int64_t bad_index_row(std::int64_t key) {
  return key / kBadIndexArgs;
}
EMBROPE_HD constexpr BadIndexArg bad_index_arg(std::int64_t key) {
  return static_cast<BadIndexArg>(key % kBadIndexArgs);
}

// What the record says of the row its key names: the value as given and its valid range.
struct BadIndexValue {
  std::int64_t value = 0, lower = 0, upper = 0;
};

// Writes the description of the record's key (GPU: by the last block, after the atomics).
EMBROPE_HD void describe_bad_index(BadIndexRecord* record, BadIndexOp op, BadIndexValue v) {
  record->value = v.value;
  record->lower = v.lower;
  record->upper = v.upper;
  record->op = static_cast<std::int32_t>(op);
}

// CPU kernels, after their parallel loop has reduced the first bad key: keeps it if it comes
// before what the record already holds (an earlier call on the same DeferredStatus), and
// describes it with describe(key), called only then.
template <typename Describe>
void lower_bad_index(BadIndexRecord* record, std::int64_t key, BadIndexOp op, Describe&& describe) {
  if (key == kNoBadIndex || key >= record->key) return;
  record->key = key;
  describe_bad_index(record, op, describe(key));
}

}  // namespace embrope::internal

EMBROPE_BEGIN_NAMESPACE

std::string describe_bad_index(const internal::BadIndexRecord& record);
[[noreturn]] void throw_bad_index(const internal::BadIndexRecord& record);

// Runs launch(record) where record is where the kernel reports bad rows: the caller's deferred
// status, or (default policy) a record of this call that is checked before returning, which
// on a GPU costs one synchronisation of the stream.
void run_with_bad_index_policy(const char* op, Device device, Stream stream,
                               DeferredStatus* deferred,
                               const std::function<void(internal::BadIndexRecord*)>& launch);

EMBROPE_END_NAMESPACE
