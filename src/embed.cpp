// embed: validate once and fill EmbedParams (prepare), then run the CPU or CUDA kernel.
#include <cmath>
#include <utility>

#include "backend.hpp"
#include "embed_args.hpp"
#include "embrope/embed.hpp"
#include "embrope/version.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

constexpr const char* kOp = "embed";
using validate::fail;

// A [rows, D] table in the table's dtype on the table's device.
void check_table(const char* name, const Tensor& t, const Tensor& table) {
  validate::check_view(kOp, name, t, 2, 2);
  validate::check_same_device(kOp, name, t, "table", table.device());
  validate::check_same_dtype(kOp, name, t, "table", table.dtype());
  validate::check_last_contiguous(kOp, name, t);
  validate::check_dim(kOp, name, t, 1, table.shape(1), "the embedding dim D of table");
}

// A norm weight or bias: [D] contiguous, float32 or the table's dtype, on the table's device.
void check_norm_vector(const char* name, const Tensor& t, const Tensor& table) {
  validate::check_view(kOp, name, t, 1, 1);
  validate::check_same_device(kOp, name, t, "table", table.device());
  validate::check_float32_or_dtype(kOp, name, t, "table", table.dtype());
  validate::check_last_contiguous(kOp, name, t);
  validate::check_dim(kOp, name, t, 0, table.shape(1), "the embedding dim D of table");
}

// The normalisation options (EmbedOptions::norm and the tensors that go with it).
void set_norm(const Tensor& ids, const Tensor& out, const Tensor& table, const EmbedOptions& o,
              internal::EmbedParams& p) {
  if (o.norm == Normalization::none) {
    if (o.norm_weight || o.norm_bias || o.pre_norm_out) {
      fail(kOp, "norm_weight, norm_bias or pre_norm_out is given but norm is none");
    }
    if (o.norm_unit_offset) fail(kOp, "norm_unit_offset is set but norm is none");
    return;
  }
  check_norm_settings(kOp, o.norm, o.vocab_shard, o.norm_eps, o.norm_unit_offset,
                      o.norm_weight.has_value());
  if (o.norm_bias && o.norm != Normalization::layer_norm) {
    fail(kOp, "norm_bias is given but norm is rms_norm (a bias is for layer_norm only)");
  }
  p.norm = o.norm;
  p.norm_eps = o.norm_eps;
  p.norm_unit_offset = o.norm_unit_offset;
  if (o.norm_weight) {
    check_norm_vector("norm_weight", *o.norm_weight, table);
    p.norm_weight = o.norm_weight->data();
    p.norm_weight_dtype = o.norm_weight->dtype();
  }
  if (o.norm_bias) {
    check_norm_vector("norm_bias", *o.norm_bias, table);
    p.norm_bias = o.norm_bias->data();
    p.norm_bias_dtype = o.norm_bias->dtype();
  }
  if (o.pre_norm_out) {
    const Tensor& pre = *o.pre_norm_out;
    validate::check_view(kOp, "pre_norm_out", pre, out.ndim(), out.ndim());
    validate::check_same_device(kOp, "pre_norm_out", pre, "table", table.device());
    validate::check_float32_or_dtype(kOp, "pre_norm_out", pre, "table", table.dtype());
    validate::check_last_contiguous(kOp, "pre_norm_out", pre);
    for (int d = 0; d < out.ndim(); ++d) {
      validate::check_dim(kOp, "pre_norm_out", pre, d, out.shape(d), "the shape of out");
    }
    p.pre_norm_out = pre.data();
    p.pre_norm_dtype = pre.dtype();
    for (int d = 0; d < ids.ndim(); ++d) {
      p.index.stride[internal::RowIndex::pre_norm_out][d] = pre.stride(d);
    }
  }
}

// Validates every argument and fills the parameters of the call.
internal::EmbedParams prepare(const Tensor& table, const Tensor& ids, const Tensor& out,
                              const EmbedOptions& o) {
  validate::check_view(kOp, "table", table, 2, 2);
  validate::check_value_dtype(kOp, "table", table);
  validate::check_last_contiguous(kOp, "table", table);
  const Device device = table.device();
  validate::check_device_usable(kOp, device);
  const std::int64_t dim = table.shape(1);

  validate::check_view(kOp, "ids", ids, 0, kMaxDims - 1);
  validate::check_index_dtype(kOp, "ids", ids);
  validate::check_same_device(kOp, "ids", ids, "table", device);

  validate::check_view(kOp, "out", out, ids.ndim() + 1, ids.ndim() + 1);
  validate::check_same_device(kOp, "out", out, "table", device);
  validate::check_same_dtype(kOp, "out", out, "table", table.dtype());
  validate::check_last_contiguous(kOp, "out", out);
  for (int d = 0; d < ids.ndim(); ++d) {
    validate::check_dim(kOp, "out", out, d, ids.shape(d), "the shape of ids");
  }
  validate::check_dim(kOp, "out", out, ids.ndim(), dim, "the embedding dim D of table");
  if (!std::isfinite(o.scale)) fail(kOp, "scale {} must be finite", o.scale);

  internal::EmbedParams p;
  p.dtype = table.dtype();
  set_rows(ids, out, p);
  p.table = table.data();
  p.vocab_size = table.shape(0);
  p.table_stride = table.stride(0);
  p.vocab_start = o.vocab_start;
  p.vocab_shard = o.vocab_shard;
  p.scale = o.scale;
  check_vocab_start(kOp, o.vocab_start, table.shape(0));

  p.positions = o.positions;
  const bool uses_positions = o.positions != PositionEncoding::none;
  if (!uses_positions && (o.position_table || o.position_ids || o.position_offsets)) {
    fail(kOp, "position tensors are given but positions is PositionEncoding::none");
  }
  if (o.positions == PositionEncoding::learned) {
    if (!o.position_table) fail(kOp, "learned positions need a position_table");
    check_table("position_table", *o.position_table, table);
    p.position_table = o.position_table->data();
    p.max_positions = o.position_table->shape(0);
    p.position_table_stride = o.position_table->stride(0);
  }
  if (o.positions == PositionEncoding::sinusoidal) {
    if (o.position_table) fail(kOp, "position_table is given but positions are sinusoidal");
    if (dim % 2 != 0) fail(kOp, "sinusoidal positions need an even D, got D {}", dim);
    if (!(std::isfinite(o.sinusoid_base) && o.sinusoid_base >= 1.0)) {
      fail(kOp, "sinusoid_base {} must be finite and at least 1 (frequencies at most 1)",
           o.sinusoid_base);
    }
    p.sinusoid_base = o.sinusoid_base;
    p.sinusoid_layout = o.sinusoid_layout;
  }
  if (uses_positions) {
    set_row_positions(kOp, ids, o.position_ids, o.position_offsets, p);
  }

  if (o.type_table || o.type_ids) {
    if (!o.type_table || !o.type_ids) fail(kOp, "type_table and type_ids come together");
    check_table("type_table", *o.type_table, table);
    set_row_types(kOp, ids, *o.type_ids, o.type_table->shape(0), p);
    p.type_table = o.type_table->data();
    p.type_table_stride = o.type_table->stride(0);
  }

  set_norm(ids, out, table, o, p);

  // The output shares no memory with itself or with any input (every input is read while
  // other rows of out are written).
  validate::check_no_self_overlap(kOp, "out", out);
  validate::check_no_overlap(kOp, "out", out, "table", table);
  validate::check_no_overlap(kOp, "out", out, "ids", ids);
  const std::pair<const char*, const std::optional<Tensor>*> optional_inputs[] = {
      {"position_table", &o.position_table},
      {"position_ids", &o.position_ids},
      {"position_offsets", &o.position_offsets},
      {"type_table", &o.type_table},
      {"type_ids", &o.type_ids},
      {"norm_weight", &o.norm_weight},
      {"norm_bias", &o.norm_bias}};
  for (const auto& [name, input] : optional_inputs) {
    if (*input) validate::check_no_overlap(kOp, "out", out, name, **input);
  }
  if (o.pre_norm_out) {
    const Tensor& pre = *o.pre_norm_out;
    validate::check_no_self_overlap(kOp, "pre_norm_out", pre);
    validate::check_no_overlap(kOp, "pre_norm_out", pre, "out", out);
    validate::check_no_overlap(kOp, "pre_norm_out", pre, "table", table);
    validate::check_no_overlap(kOp, "pre_norm_out", pre, "ids", ids);
    for (const auto& [name, input] : optional_inputs) {
      if (*input) validate::check_no_overlap(kOp, "pre_norm_out", pre, name, **input);
    }
  }

  return p;
}

}  // namespace

void embed(const Tensor& table, const Tensor& ids, const Tensor& out, const EmbedOptions& o) {
  internal::EmbedParams p = prepare(table, ids, out, o);
  if (p.rows == 0 || p.dim == 0) return;
  run_kernel(kOp, table.device(), o.stream, o.deferred, p, p.bad, cpu::embed, gpu::embed);
}

EMBROPE_END_NAMESPACE
