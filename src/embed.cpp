// embed: validate once and fill EmbedParams (prepare), then run the CPU or CUDA kernel.
#include <cmath>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "embed_args.hpp"
#include "embrope/embed.hpp"
#include "embrope/version.hpp"
#include "quant_row.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

constexpr const char* kOp = "embed";
using validate::fail;

// What the other arguments are checked against: the token table's device and D, and the value
// dtype of the call with the argument it comes from (a float table's dtype; out's with a
// quantized table).
struct CallShape {
  Device device;
  std::int64_t dim;
  DType dtype;
  const char* dtype_from;
};

// A [rows, D] table in the call's value dtype on the table's device.
void check_table(const char* name, const Tensor& t, const CallShape& call) {
  validate::check_view(kOp, name, t, 2, 2);
  validate::check_same_device(kOp, name, t, "table", call.device);
  validate::check_same_dtype(kOp, name, t, call.dtype_from, call.dtype);
  validate::check_last_contiguous(kOp, name, t);
  validate::check_dim(kOp, name, t, 1, call.dim, "the embedding dim D of table");
}

// A norm weight or bias: [D] contiguous, float32 or the call's value dtype, on the table's
// device.
void check_norm_vector(const char* name, const Tensor& t, const CallShape& call) {
  validate::check_view(kOp, name, t, 1, 1);
  validate::check_same_device(kOp, name, t, "table", call.device);
  validate::check_float32_or_dtype(kOp, name, t, call.dtype_from, call.dtype);
  validate::check_last_contiguous(kOp, name, t);
  validate::check_dim(kOp, name, t, 0, call.dim, "the embedding dim D of table");
}

// The normalisation options (EmbedOptions::norm and the tensors that go with it).
void set_norm(const Tensor& ids, const Tensor& out, const CallShape& call, const EmbedOptions& o,
              internal::EmbedParams& p) {
  check_norm_eps(kOp, o.norm_eps);
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
    check_norm_vector("norm_weight", *o.norm_weight, call);
    p.norm_weight = o.norm_weight->data();
    p.norm_weight_dtype = o.norm_weight->dtype();
  }
  if (o.norm_bias) {
    check_norm_vector("norm_bias", *o.norm_bias, call);
    p.norm_bias = o.norm_bias->data();
    p.norm_bias_dtype = o.norm_bias->dtype();
  }
  if (o.pre_norm_out) {
    const Tensor& pre = *o.pre_norm_out;
    validate::check_view(kOp, "pre_norm_out", pre, out.ndim(), out.ndim());
    validate::check_same_device(kOp, "pre_norm_out", pre, "table", call.device);
    validate::check_float32_or_dtype(kOp, "pre_norm_out", pre, call.dtype_from, call.dtype);
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

// Validates every argument but the token table (checked by the caller, which fills in its
// fields) and fills the parameters of the call. `table_inputs`: the token table's tensors, which
// out and pre_norm_out must not overlap.
internal::EmbedParams prepare(
    const CallShape& call, std::int64_t vocab_size, const Tensor& ids, const Tensor& out,
    const EmbedOptions& o, const std::vector<std::pair<const char*, const Tensor*>>& table_inputs) {
  const Device device = call.device;
  validate::check_device_usable(kOp, device);
  const std::int64_t dim = call.dim;

  validate::check_view(kOp, "ids", ids, 0, kMaxDims - 1);
  validate::check_index_dtype(kOp, "ids", ids);
  validate::check_same_device(kOp, "ids", ids, "table", device);

  validate::check_view(kOp, "out", out, ids.ndim() + 1, ids.ndim() + 1);
  validate::check_same_device(kOp, "out", out, "table", device);
  validate::check_same_dtype(kOp, "out", out, call.dtype_from, call.dtype);
  validate::check_last_contiguous(kOp, "out", out);
  for (int d = 0; d < ids.ndim(); ++d) {
    validate::check_dim(kOp, "out", out, d, ids.shape(d), "the shape of ids");
  }
  validate::check_dim(kOp, "out", out, ids.ndim(), dim, "the embedding dim D of table");
  if (!std::isfinite(o.scale)) fail(kOp, "scale {} must be finite", o.scale);

  internal::EmbedParams p;
  p.dtype = call.dtype;
  set_rows(ids, out, p);
  p.vocab_size = vocab_size;
  p.vocab_start = o.vocab_start;
  p.vocab_shard = o.vocab_shard;
  p.scale = o.scale;
  check_vocab_start(kOp, o.vocab_start, vocab_size);

  if (o.positions != PositionEncoding::none && o.positions != PositionEncoding::learned &&
      o.positions != PositionEncoding::sinusoidal) {
    fail(kOp, "positions {} is not a PositionEncoding (none, learned or sinusoidal)",
         static_cast<int>(o.positions));
  }
  if (o.sinusoid_layout != SinusoidLayout::interleaved &&
      o.sinusoid_layout != SinusoidLayout::split) {
    fail(kOp, "sinusoid_layout {} is not a SinusoidLayout (interleaved or split)",
         static_cast<int>(o.sinusoid_layout));
  }
  p.positions = o.positions;
  const bool uses_positions = o.positions != PositionEncoding::none;
  if (!uses_positions && (o.position_table || o.position_ids || o.position_offsets)) {
    fail(kOp, "position tensors are given but positions is PositionEncoding::none");
  }
  if (o.positions == PositionEncoding::learned) {
    if (!o.position_table) fail(kOp, "learned positions need a position_table");
    check_table("position_table", *o.position_table, call);
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
    check_table("type_table", *o.type_table, call);
    set_row_types(kOp, ids, *o.type_ids, o.type_table->shape(0), p);
    p.type_table = o.type_table->data();
    p.type_table_stride = o.type_table->stride(0);
  }

  set_norm(ids, out, call, o, p);

  // The output shares no memory with itself or with any input (every input is read while
  // other rows of out are written).
  validate::check_no_self_overlap(kOp, "out", out);
  for (const auto& [name, input] : table_inputs) {
    validate::check_no_overlap(kOp, "out", out, name, *input);
  }
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
    for (const auto& [name, input] : table_inputs) {
      validate::check_no_overlap(kOp, "pre_norm_out", pre, name, *input);
    }
    validate::check_no_overlap(kOp, "pre_norm_out", pre, "ids", ids);
    for (const auto& [name, input] : optional_inputs) {
      if (*input) validate::check_no_overlap(kOp, "pre_norm_out", pre, name, **input);
    }
  }

  return p;
}

const char* format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::int8:
      return "int8";
    case QuantFormat::int4:
      return "int4";
    case QuantFormat::float8_e4m3fn:
      return "float8_e4m3fn";
    case QuantFormat::float8_e5m2:
      return "float8_e5m2";
    case QuantFormat::gguf_q8_0:
      return "gguf_q8_0";
    case QuantFormat::gguf_q4_0:
      return "gguf_q4_0";
    case QuantFormat::gguf_q4_k:
      return "gguf_q4_k";
    case QuantFormat::gguf_q6_k:
      return "gguf_q6_k";
  }
  fail(kOp, "table.format {} is not a QuantFormat", static_cast<int>(f));
}

// A quantized table's scales or zero points ("table.scales", "table.zero_points"): one element
// ([], [1] or [1, 1]: the table's), [V] or [V, 1] (one per row) or [V, G] (G groups of D / G
// values).
// Returns the row stride (0 for one per table) and sets the group size.
std::int64_t check_scale_shape(const char* name, const Tensor& t, std::int64_t vocab,
                               std::int64_t dim, std::int64_t& group_size) {
  validate::check_view(kOp, name, t, 0, 2);
  bool one = true;  // a single element: the whole table's (with V 1, a row's: the same)
  for (int d = 0; d < t.ndim(); ++d) one = one && t.shape(d) == 1;
  if (one) {
    group_size = dim;
    return 0;
  }
  validate::check_dim(kOp, name, t, 0, vocab, "the rows V of table.data");
  const std::int64_t groups = t.ndim() == 2 ? t.shape(1) : 1;
  if (groups > 1) validate::check_last_contiguous(kOp, name, t);
  if (groups < 1 || dim % groups != 0) {
    fail(kOp, "{} has {} columns, which must divide D {} (one scale per group of D / G values)",
         name, groups, dim);
  }
  group_size = dim / groups;
  return t.stride(0);
}

// Validates a quantized table against its format and fills p.quant.
void set_quant_table(const QuantizedTable& t, internal::EmbedParams& p) {
  const char* format = format_name(t.format);
  const Tensor& data = t.data;
  validate::check_view(kOp, "table.data", data, 2, 2);
  validate::check_last_contiguous(kOp, "table.data", data);
  const std::int64_t dim = t.dim;
  if (dim < 0) fail(kOp, "table.dim {} must be at least 0", dim);
  const bool gguf = internal::is_gguf_format(t.format);
  DType want = DType::uint8;
  std::int64_t columns = dim;
  if (t.format == QuantFormat::int8) want = DType::int8;
  if (t.format == QuantFormat::float8_e4m3fn) want = DType::float8_e4m3fn;
  if (t.format == QuantFormat::float8_e5m2) want = DType::float8_e5m2;
  if (t.format == QuantFormat::int4) {
    if (dim % 2 != 0) fail(kOp, "format int4 packs two values per byte: D {} must be even", dim);
    columns = dim / 2;
  }
  if (gguf) {
    const detail::GgufBlock block = internal::gguf_block_of(t.format);
    const int values = detail::gguf_block_values(block);
    if (dim % values != 0) {
      fail(kOp, "format {} stores rows in blocks of {} values: D {} must be a multiple of {}",
           format, values, dim, values);
    }
    // Compared by blocks: dim / values * bytes could overflow for a huge dim.
    const std::int64_t bytes = detail::gguf_block_bytes(block);
    if (data.shape(1) % bytes != 0 || data.shape(1) / bytes != dim / values) {
      fail(kOp,
           "table.data has {} columns; format {} stores a row of D {} in {} blocks of {} bytes",
           data.shape(1), format, dim, dim / values, bytes);
    }
    columns = data.shape(1);
  }
  if (data.dtype() != want) {
    fail(kOp, "table.data has dtype {}; format {} is stored as {}", dtype_name(data.dtype()),
         format, dtype_name(want));
  }
  if (data.shape(1) != columns) {
    fail(kOp, "table.data has {} columns; format {} stores a row of D {} in {} {}", data.shape(1),
         format, dim, columns, gguf || t.format == QuantFormat::int4 ? "bytes" : "values");
  }
  const std::int64_t vocab = data.shape(0);
  internal::QuantTable& q = p.quant;
  q.format = t.format;
  q.data = static_cast<const std::uint8_t*>(data.data());
  q.row_stride = data.stride(0);
  q.row_bytes = data.shape(1);
  if (gguf) {
    if (t.scales || t.zero_points) {
      fail(kOp,
           "format {} keeps its scales in its blocks: table.scales and table.zero_points "
           "must be absent",
           format);
    }
    return;
  }
  if (!t.scales) fail(kOp, "format {} needs table.scales", format);
  const Tensor& scales = *t.scales;
  validate::check_value_dtype(kOp, "table.scales", scales);
  validate::check_same_device(kOp, "table.scales", scales, "table.data", data.device());
  q.scales = scales.data();
  q.scale_dtype = scales.dtype();
  q.scale_stride = check_scale_shape("table.scales", scales, vocab, dim, q.group_size);
  if (t.zero_points) {
    const Tensor& zp = *t.zero_points;
    if (t.format != QuantFormat::int8 && t.format != QuantFormat::int4) {
      fail(kOp, "format {} has no zero points: table.zero_points must be absent", format);
    }
    validate::check_same_device(kOp, "table.zero_points", zp, "table.data", data.device());
    const DType d = zp.dtype();
    if (!is_value_dtype(d) && d != DType::int8 && d != DType::int32) {
      fail(kOp,
           "table.zero_points has dtype {}; it must be float32, float16, bfloat16, int8 or "
           "int32",
           dtype_name(d));
    }
    if (zp.ndim() != scales.ndim()) {
      fail(kOp, "table.zero_points has shape {}; it must have the shape of table.scales, {}",
           validate::shape_string(zp), validate::shape_string(scales));
    }
    for (int i = 0; i < zp.ndim(); ++i) {
      validate::check_dim(kOp, "table.zero_points", zp, i, scales.shape(i),
                          "the shape of table.scales");
    }
    std::int64_t group_size = 0;
    q.zero_points = zp.data();
    q.zero_point_dtype = d;
    q.zero_point_stride = check_scale_shape("table.zero_points", zp, vocab, dim, group_size);
  }
  if (dim == 0) q.group_size = 1;
  if (q.group_size >= dim) {
    q.group_shift = 62;  // every j < dim in group 0
  } else if ((q.group_size & (q.group_size - 1)) == 0) {
    q.group_shift = 0;
    while ((std::int64_t{1} << q.group_shift) < q.group_size) ++q.group_shift;
  }
}

}  // namespace

void embed(const Tensor& table, const Tensor& ids, const Tensor& out, const EmbedOptions& o) {
  validate::check_view(kOp, "table", table, 2, 2);
  validate::check_value_dtype(kOp, "table", table);
  validate::check_last_contiguous(kOp, "table", table);
  const CallShape call{table.device(), table.shape(1), table.dtype(), "table"};
  internal::EmbedParams p = prepare(call, table.shape(0), ids, out, o, {{"table", &table}});
  p.table = table.data();
  p.table_stride = table.stride(0);
  if (p.rows == 0 || p.dim == 0) return;
  run_kernel(kOp, table.device(), o.stream, o.deferred, p, p.bad, cpu::embed, gpu::embed);
}

void embed(const QuantizedTable& table, const Tensor& ids, const Tensor& out,
           const EmbedOptions& o) {
  internal::EmbedParams quant;
  set_quant_table(table, quant);
  validate::check_view(kOp, "out", out, 1, kMaxDims);
  validate::check_value_dtype(kOp, "out", out);
  const CallShape call{table.data.device(), table.dim, out.dtype(), "out"};
  std::vector<std::pair<const char*, const Tensor*>> inputs = {{"table.data", &table.data}};
  if (table.scales) inputs.emplace_back("table.scales", &*table.scales);
  if (table.zero_points) inputs.emplace_back("table.zero_points", &*table.zero_points);
  internal::EmbedParams p = prepare(call, table.data.shape(0), ids, out, o, inputs);
  p.quantized = true;
  p.quant = quant.quant;
  if (p.rows == 0 || p.dim == 0) return;
  run_kernel(kOp, call.device, o.stream, o.deferred, p, p.bad, cpu::embed, gpu::embed);
}

EMBROPE_END_NAMESPACE
