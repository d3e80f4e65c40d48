// Per-row logic of embed and embed_backward, shared by the CPU and CUDA backends: which
// token row, position and type row a flat row n uses, whether any of them is out of range
// (docs/ops.md, "embed"), and which gradient rows it feeds.
#pragma once

#include <cstdint>

#include "bad_index.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/sinusoid.hpp"
#include "embed_params.hpp"
#include "tensor_access.hpp"

namespace embrope::internal {

struct EmbedRow {
  std::int64_t out_offset = 0;            // element offset of the row in out
  std::int64_t pre_norm_offset = 0;       // element offset of the row in pre_norm_out
  std::int64_t grad_pre_norm_offset = 0;  // embed_backward: the row in grad_pre_norm
  std::int64_t token = 0;                 // row of the token table (valid when token_hit)
  bool token_hit = true;                  // false: a shard miss, the token part is zero
  std::int64_t position = 0;              // position (learned or sinusoidal)
  std::int64_t type = 0;                  // row of the type table
  std::int64_t bad_key = kNoBadIndex;     // bad_index_key of the first bad argument, if any
  BadIndexValue bad;                      // and its value and range
};

EMBROPE_HD void mark_bad(EmbedRow& r, std::int64_t row, BadIndexArg arg, std::int64_t value,
                         std::int64_t lower, std::int64_t upper) {
  if (r.bad_key != kNoBadIndex) return;  // the first argument in order wins
  r.bad_key = bad_index_key(row, arg);
  r.bad = {value, lower, upper};
}

EMBROPE_HD EmbedRow resolve_embed_row(const EmbedParams& p, std::int64_t row) {
  std::int64_t offsets[RowIndex::count];
  row_offsets(p.index, row, offsets);
  EmbedRow r;
  r.out_offset = offsets[RowIndex::out];
  r.pre_norm_offset = offsets[RowIndex::pre_norm_out];
  r.grad_pre_norm_offset = offsets[RowIndex::grad_pre_norm];
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
    // Learned: the table's rows; sinusoidal: the positions whose float64 angles stay exact
    // enough (detail/sinusoid.hpp).
    const std::int64_t upper =
        p.positions == PositionEncoding::learned ? p.max_positions : detail::kSinusoidPositionLimit;
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

// The norm's factors of element j as float32: the weight (1 + w with a unit offset; 1 without
// a weight) and the bias (0 without). Each backend computes them once per call: the CPU into
// vectors, the GPU into the call's workspace (cuda/embed.cu, norm_factor_kernel).
struct NormFactor {
  float weight, bias;
};
EMBROPE_HD NormFactor norm_factor(const EmbedParams& p, std::int64_t j) {
  return {p.norm_weight == nullptr
              ? 1.0f
              : detail::norm_weight_factor(load_vector_value(p.norm_weight, p.norm_weight_dtype, j),
                                           p.norm_unit_offset),
          p.norm_bias == nullptr ? 0.0f : load_vector_value(p.norm_bias, p.norm_bias_dtype, j)};
}

// Where row n of grad_out goes: the row of each gradient table (-1: nowhere), and the bad
// index found, if any (a bad row gives nothing to any table: its forward output was zero).
struct BackwardRow {
  std::int64_t out_offset = 0;  // element offset of the row in grad_out
  std::int64_t target[EmbedBackwardParams::count] = {-1, -1, -1};
  std::int64_t bad_key = kNoBadIndex;
};

EMBROPE_HD BackwardRow resolve_backward_row(const EmbedBackwardParams& p, std::int64_t n) {
  const EmbedRow r = resolve_embed_row(p.rows, n);
  BackwardRow b;
  b.out_offset = r.out_offset;
  b.bad_key = r.bad_key;
  if (r.bad_key != kNoBadIndex) return b;
  // r.token + vocab_start is the id itself (it was in the shard), so no overflow.
  const bool padding = p.has_padding && r.token + p.rows.vocab_start == p.padding_idx;
  if (p.targets[EmbedBackwardParams::token].grad != nullptr && r.token_hit && !padding) {
    b.target[EmbedBackwardParams::token] = r.token;
  }
  if (p.targets[EmbedBackwardParams::position].grad != nullptr) {
    b.target[EmbedBackwardParams::position] = r.position;
  }
  if (p.targets[EmbedBackwardParams::type].grad != nullptr) {
    b.target[EmbedBackwardParams::type] = r.type;
  }
  return b;
}

// The table gradients' pass of an embed_backward with a norm: the same call, reading in the
// place of grad_out the float32 rows dx [ids.shape..., D] (contiguous) that the norm's
// backward wrote.
inline EmbedBackwardParams norm_scatter_params(const EmbedBackwardParams& p, float* dx) {
  EmbedBackwardParams s = p;
  s.rows.out = dx;
  s.rows.dtype = DType::float32;
  std::int64_t stride = p.rows.dim;
  for (int d = p.rows.index.ndim - 1; d >= 0; --d) {
    s.rows.index.stride[RowIndex::out][d] = stride;
    stride *= p.rows.index.shape[d];
  }
  s.rows.norm = Normalization::none;
  return s;
}

}  // namespace embrope::internal
