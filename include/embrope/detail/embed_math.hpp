// Per-row logic of embed, shared by the CPU and CUDA backends: which token row, position and
// type row a flat row n uses, and whether any of them is out of range (DESIGN.md 3.1, 3.2).
#pragma once

#include <cstdint>

#include "embrope/detail/config.hpp"
#include "embrope/detail/params.hpp"

namespace embrope::detail {

struct EmbedRow {
  std::int64_t out_offset = 0;         // element offset of the row in out
  std::int64_t token = 0;              // row of the token table (valid when token_hit)
  bool token_hit = true;               // false: a shard miss, the token part is zero
  std::int64_t position = 0;           // position (learned or sinusoidal)
  std::int64_t type = 0;               // row of the type table
  std::int64_t bad_key = kNoBadIndex;  // bad_index_key of the first bad argument, if any
  std::int64_t bad_value = 0, bad_lower = 0, bad_upper = 0;
};

EMBROPE_HD void mark_bad(EmbedRow& r, std::int64_t row, BadIndexArg arg, std::int64_t value,
                         std::int64_t lower, std::int64_t upper) {
  if (r.bad_key != kNoBadIndex) return;  // the first argument in order wins
  r.bad_key = bad_index_key(row, arg);
  r.bad_value = value;
  r.bad_lower = lower;
  r.bad_upper = upper;
}

EMBROPE_HD EmbedRow resolve_embed_row(const EmbedParams& p, std::int64_t row) {
  std::int64_t offsets[RowIndex::count];
  row_offsets(p.index, row, offsets);
  EmbedRow r;
  r.out_offset = offsets[RowIndex::out];
  const std::int64_t id = load_index(p.ids, p.id_dtype, offsets[RowIndex::ids]);
  // Compared before subtracting: no overflow for any id (INT64_MIN included).
  r.token_hit = id >= p.vocab_start && id - p.vocab_start < p.vocab_size;
  r.token = r.token_hit ? id - p.vocab_start : 0;
  if (!r.token_hit) {
    if (!p.vocab_shard) {
      mark_bad(r, row, BadIndexArg::ids, id, p.vocab_start, p.vocab_start + p.vocab_size);
    }
  }
  if (p.positions != PositionEncoding::none) {
    BadIndexArg arg = BadIndexArg::position_ids;
    if (p.position_ids != nullptr) {
      r.position = load_index(p.position_ids, p.position_id_dtype, offsets[RowIndex::position_ids]);
    } else {
      arg = BadIndexArg::implicit_position;
      const std::int64_t b = row / p.seq_len;
      const std::int64_t offset = p.position_offsets == nullptr
                                      ? 0
                                      : load_index(p.position_offsets, p.position_offset_dtype,
                                                   b * p.position_offset_stride);
      const std::int64_t s = row - b * p.seq_len;
      // offset + s, saturated: an offset near INT64_MAX must not wrap into the table.
      r.position = offset > INT64_MAX - s ? INT64_MAX : offset + s;
    }
    const std::int64_t upper =
        p.positions == PositionEncoding::learned ? p.max_positions : INT64_MAX;
    if (r.position < 0 || r.position >= upper) mark_bad(r, row, arg, r.position, 0, upper);
  }
  if (p.type_table != nullptr) {
    r.type = load_index(p.type_ids, p.type_id_dtype, offsets[RowIndex::type_ids]);
    if (r.type < 0 || r.type >= p.num_types) {
      mark_bad(r, row, BadIndexArg::type_ids, r.type, 0, p.num_types);
    }
  }
  return r;
}

}  // namespace embrope::detail
