// Row index arguments and norm settings shared by embed and embed_backward (embed_args.hpp).
#include "embed_args.hpp"

#include <cmath>

#include "validate.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

void set_rows(const Tensor& ids, const Tensor& out, internal::EmbedParams& p) {
  p.rows = ids.numel();
  p.dim = out.shape(ids.ndim());
  p.index.ndim = ids.ndim();
  for (int d = 0; d < ids.ndim(); ++d) {
    p.index.shape[d] = ids.shape(d);
    p.index.stride[internal::RowIndex::ids][d] = ids.stride(d);
    p.index.stride[internal::RowIndex::out][d] = out.stride(d);
  }
  p.ids = ids.data();
  p.id_dtype = ids.dtype();
  p.out = out.data();
}

void check_vocab_start(const char* op, std::int64_t vocab_start, std::int64_t vocab_size) {
  if (vocab_start < 0) validate::fail(op, "vocab_start {} must not be negative", vocab_start);
  if (vocab_start > INT64_MAX - vocab_size) {
    validate::fail(op, "vocab_start {} plus the vocabulary size {} overflows int64", vocab_start,
                   vocab_size);
  }
}

void check_norm_eps(const char* op, float eps) {
  if (!(std::isfinite(eps) && eps >= 0.0f)) {
    validate::fail(op, "norm_eps {} must be finite and >= 0", eps);
  }
}

void check_norm_settings(const char* op, Normalization norm, bool vocab_shard, float eps,
                         bool unit_offset, bool has_weight) {
  if (norm != Normalization::layer_norm && norm != Normalization::rms_norm) {
    validate::fail(op, "norm {} is not a Normalization", static_cast<int>(norm));
  }
  if (vocab_shard) {
    validate::fail(op,
                   "norm cannot be combined with vocab_shard: a shard's rows are partial sums; "
                   "normalise after the sum over shards");
  }
  check_norm_eps(op, eps);
  if (unit_offset && !has_weight) {
    validate::fail(op,
                   "norm_unit_offset is set without a norm_weight (the weight applied is 1 + w)");
  }
}

void check_like_ids(const char* op, const char* name, const Tensor& t, const Tensor& ids) {
  validate::check_view(op, name, t, ids.ndim(), ids.ndim());
  validate::check_index_dtype(op, name, t);
  validate::check_same_device(op, name, t, "ids", ids.device());
  for (int d = 0; d < ids.ndim(); ++d) {
    if (t.shape(d) != ids.shape(d)) {
      validate::fail(op, "{} has shape {} but ids has {}; they must match", name,
                     validate::shape_string(t), validate::shape_string(ids));
    }
  }
}

void set_row_positions(const char* op, const Tensor& ids, const std::optional<Tensor>& position_ids,
                       const std::optional<Tensor>& position_offsets, internal::EmbedParams& p) {
  if (position_ids && position_offsets) {
    validate::fail(op,
                   "position_ids and position_offsets are exclusive (explicit or implicit "
                   "positions)");
  }
  if (position_ids) {
    check_like_ids(op, "position_ids", *position_ids, ids);
    p.position_ids = position_ids->data();
    p.position_id_dtype = position_ids->dtype();
    for (int d = 0; d < ids.ndim(); ++d) {
      p.index.stride[internal::RowIndex::position_ids][d] = position_ids->stride(d);
    }
    return;
  }
  if (ids.ndim() < 1 || ids.ndim() > 2) {
    validate::fail(op, "implicit positions need ids of shape [S] or [B, S], got {}",
                   validate::shape_string(ids));
  }
  p.seq_len = ids.shape(ids.ndim() - 1);
  if (position_offsets) {
    const Tensor& offsets = *position_offsets;
    validate::check_view(op, "position_offsets", offsets, 1, 1);
    validate::check_index_dtype(op, "position_offsets", offsets);
    validate::check_same_device(op, "position_offsets", offsets, "ids", ids.device());
    const std::int64_t rows_b = ids.ndim() == 2 ? ids.shape(0) : 1;
    validate::check_dim(op, "position_offsets", offsets, 0, rows_b, "the batch size of ids");
    p.position_offsets = offsets.data();
    p.position_offset_dtype = offsets.dtype();
    p.position_offset_stride = offsets.stride(0);
  }
}

void set_row_types(const char* op, const Tensor& ids, const Tensor& type_ids,
                   std::int64_t num_types, internal::EmbedParams& p) {
  check_like_ids(op, "type_ids", type_ids, ids);
  p.num_types = num_types;
  p.type_ids = type_ids.data();
  p.type_id_dtype = type_ids.dtype();
  for (int d = 0; d < ids.ndim(); ++d) {
    p.index.stride[internal::RowIndex::type_ids][d] = type_ids.stride(d);
  }
}

EMBROPE_END_NAMESPACE
