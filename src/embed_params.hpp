// embed's and embed_backward's parameters: the rows of a call and the tables (apply_rope_params.hpp
// says how parameters are made and used).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bad_index.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/types.hpp"
#include "tensor_access.hpp"

namespace embrope::internal {

// Row n of an embed call (a flat row-major index over ids' shape) maps to element offsets in
// ids, out (its leading dimensions), position_ids, type_ids and pre_norm_out.
struct RowIndex {
  enum Operand {
    ids = 0,
    out = 1,
    position_ids = 2,
    type_ids = 3,
    pre_norm_out = 4,   // embed's pre_norm_out; embed_backward's saved pre_norm
    grad_pre_norm = 5,  // embed_backward's grad_pre_norm
    count = 6
  };
  int ndim = 0;
  std::int64_t shape[kMaxDims] = {};
  std::int64_t stride[count][kMaxDims] = {};
};

EMBROPE_HD void row_offsets(const RowIndex& index, std::int64_t row, std::int64_t* offsets) {
  for (int t = 0; t < RowIndex::count; ++t) offsets[t] = 0;
  for (int d = index.ndim - 1; d >= 0; --d) {
    const std::int64_t extent = index.shape[d];
    const std::int64_t coord = row % extent;
    row /= extent;
    for (int t = 0; t < RowIndex::count; ++t) offsets[t] += coord * index.stride[t][d];
  }
}

// A quantized token table (embed with a QuantizedTable): data [V, row_stride bytes], and the
// scales and zero points of its int8, int4 and float8 formats, one per group of group_size
// values of a row (scale_stride: elements from a row's scales to the next; 0: one scale for
// the table).
struct QuantTable {
  QuantFormat format = QuantFormat::int8;
  const std::uint8_t* data = nullptr;
  std::int64_t row_stride = 0;  // bytes
  std::int64_t row_bytes = 0;   // bytes a row occupies
  const void* scales = nullptr;
  DType scale_dtype = DType::float32;
  std::int64_t scale_stride = 0, group_size = 1;
  // log2(group_size) where it is a power of two, 62 where one group spans the row, else -1:
  // the GPU's chunks find their group by a shift (quant_group_of).
  int group_shift = -1;
  const void* zero_points = nullptr;  // null: 0
  DType zero_point_dtype = DType::float32;
  std::int64_t zero_point_stride = 0;
};

struct EmbedParams {
  DType dtype = DType::float32;  // of out and of every float table
  std::int64_t rows = 0;         // number of ids
  std::int64_t dim = 0;          // D
  RowIndex index;
  const void* ids = nullptr;
  DType id_dtype = DType::int64;
  void* out = nullptr;

  const void* table = nullptr;  // the float token table (unused when quantized)
  std::int64_t vocab_size = 0, table_stride = 0, vocab_start = 0;
  bool quantized = false;  // the token table is `quant`
  QuantTable quant;
  bool vocab_shard = false;
  float scale = 1.0f;

  PositionEncoding positions = PositionEncoding::none;
  const void* position_table = nullptr;
  std::int64_t max_positions = 0, position_table_stride = 0;
  const void* position_ids = nullptr;  // null: implicit offset_b + s
  DType position_id_dtype = DType::int64;
  const void* position_offsets = nullptr;  // null: offsets are 0
  DType position_offset_dtype = DType::int64;
  std::int64_t position_offset_stride = 0;
  std::int64_t seq_len = 1;  // S of implicit positions: row n is (b, s) = (n / S, n % S)
  double sinusoid_base = 10000.0;
  SinusoidLayout sinusoid_layout = SinusoidLayout::interleaved;

  const void* type_table = nullptr;
  std::int64_t num_types = 0, type_table_stride = 0;
  const void* type_ids = nullptr;
  DType type_id_dtype = DType::int64;

  // Normalisation of the summed row (detail/norm_math.hpp). weight and bias: [D] contiguous,
  // null when absent (1 and 0).
  Normalization norm = Normalization::none;
  const void* norm_weight = nullptr;
  DType norm_weight_dtype = DType::float32;
  const void* norm_bias = nullptr;
  DType norm_bias_dtype = DType::float32;
  float norm_eps = 0.0f;
  bool norm_unit_offset = false;
  void* pre_norm_out = nullptr;  // the summed row before normalisation, or null
  DType pre_norm_dtype = DType::float32;

  BadIndexRecord* bad = nullptr;
};

// ----------------------------------------------------------------- embed_backward ----

// One gradient table of embed_backward: [rows, D] with row stride `stride`, float32 or the
// dtype of grad_out. grad += weight * (sum of the grad_out rows that map to a row).
struct GradTable {
  void* grad = nullptr;  // null: not requested
  DType dtype = DType::float32;
  std::int64_t rows = 0, stride = 0;
  float weight = 1.0f;
};

struct EmbedBackwardParams {
  // The forward's row resolution (ids, positions, type ids and their range checks) with
  // grad_out in the place of out: rows.out is grad_out, rows.dtype its dtype. The forward's
  // table pointers are unused, except that rows.type_table is non-null exactly when type
  // gradients are requested (resolve_embed_row reads type ids only then).
  EmbedParams rows;
  // The three gradients, in key order: token table, position table, type table.
  enum Target { token = 0, position = 1, type = 2, count = 3 };
  GradTable targets[count];
  bool has_padding = false;
  std::int64_t padding_idx = 0;
  BackwardMode mode = BackwardMode::deterministic;
  void* workspace = nullptr;  // CUDA deterministic mode; null: allocate on the stream
  std::size_t workspace_bytes = 0;

  // embed's norm, differentiated first (norm_backward_row on the CPU, the norm kernels on the
  // GPU): rows.norm, rows.norm_weight (and its dtype), rows.norm_eps and
  // rows.norm_unit_offset are the forward's; pre_norm (offsets: RowIndex::pre_norm_out) is
  // the saved pre-norm row; grad_pre_norm (RowIndex::grad_pre_norm) the gradient it received
  // directly, or null. The table gradients then sum the float32 rows dx the norm's backward
  // wrote (norm_scatter_params).
  const void* pre_norm = nullptr;
  DType pre_norm_dtype = DType::float32;
  const void* grad_pre_norm = nullptr;
  DType grad_pre_norm_dtype = DType::float32;
  float* grad_norm_weight = nullptr;  // [D] float32, overwritten; null: not requested
  float* grad_norm_bias = nullptr;    // the same for the bias (layer_norm)
};

}  // namespace embrope::internal
