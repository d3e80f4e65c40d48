// embed_backward: validate once and fill EmbedBackwardParams (prepare), then run the CPU or
// CUDA kernel.
#include <cmath>
#include <utility>

#include "backend.hpp"
#include "embed_args.hpp"
#include "embrope/embed.hpp"
#include "embrope/version.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

constexpr const char* kOp = "embed_backward";
using validate::fail;
using Params = internal::EmbedBackwardParams;

// A gradient table [rows, D], float32 or grad_out's dtype, on grad_out's device.
void check_grad(const char* name, const Tensor& t, const Tensor& grad_out, std::int64_t dim,
                internal::GradTable& target, float weight) {
  validate::check_view(kOp, name, t, 2, 2);
  validate::check_same_device(kOp, name, t, "grad_out", grad_out.device());
  validate::check_float32_or_dtype(kOp, name, t, "grad_out", grad_out.dtype());
  validate::check_last_contiguous(kOp, name, t);
  validate::check_dim(kOp, name, t, 1, dim, "the embedding dim D of grad_out");
  target.grad = t.data();
  target.dtype = t.dtype();
  target.rows = t.shape(0);
  target.stride = t.stride(0);
  target.weight = weight;
}

// A tensor shaped like grad_out (pre_norm, grad_pre_norm), float32 or grad_out's dtype; its
// leading strides go to RowIndex operand `operand`.
void check_like_grad_out(const char* name, const Tensor& t, const Tensor& grad_out,
                         internal::RowIndex::Operand operand, Params& p) {
  validate::check_view(kOp, name, t, grad_out.ndim(), grad_out.ndim());
  validate::check_same_device(kOp, name, t, "grad_out", grad_out.device());
  validate::check_float32_or_dtype(kOp, name, t, "grad_out", grad_out.dtype());
  validate::check_last_contiguous(kOp, name, t);
  for (int d = 0; d < grad_out.ndim(); ++d) {
    validate::check_dim(kOp, name, t, d, grad_out.shape(d), "the shape of grad_out");
  }
  for (int d = 0; d + 1 < grad_out.ndim(); ++d) p.rows.index.stride[operand][d] = t.stride(d);
}

// A [D] vector on grad_out's device: the norm weight (float32 or grad_out's dtype) or one of
// the norm's gradients (float32).
void check_norm_vector(const char* name, const Tensor& t, const Tensor& grad_out, bool gradient) {
  validate::check_view(kOp, name, t, 1, 1);
  validate::check_same_device(kOp, name, t, "grad_out", grad_out.device());
  if (gradient) {
    validate::check_same_dtype(kOp, name, t, "a norm gradient", DType::float32);
  } else {
    validate::check_float32_or_dtype(kOp, name, t, "grad_out", grad_out.dtype());
  }
  validate::check_last_contiguous(kOp, name, t);
  validate::check_dim(kOp, name, t, 0, grad_out.shape(grad_out.ndim() - 1),
                      "the embedding dim D of grad_out");
}

// The norm's options (EmbedBackwardOptions::norm and the tensors that go with it).
void set_norm(const Tensor& grad_out, const EmbedBackwardOptions& o, Params& p) {
  check_norm_eps(kOp, o.norm_eps);
  if (o.norm == Normalization::none) {
    if (o.pre_norm || o.norm_weight || o.grad_pre_norm || o.grad_norm_weight || o.grad_norm_bias) {
      fail(kOp,
           "pre_norm, norm_weight, grad_pre_norm, grad_norm_weight or grad_norm_bias is given "
           "but norm is none");
    }
    if (o.norm_unit_offset) fail(kOp, "norm_unit_offset is set but norm is none");
    return;
  }
  check_norm_settings(kOp, o.norm, o.vocab_shard, o.norm_eps, o.norm_unit_offset,
                      o.norm_weight.has_value());
  if (!o.pre_norm) {
    fail(kOp, "norm is set but pre_norm (the forward's pre_norm_out) is not given");
  }
  if (o.grad_norm_bias && o.norm != Normalization::layer_norm) {
    fail(kOp, "grad_norm_bias is given but norm is rms_norm (a bias is for layer_norm only)");
  }
  internal::EmbedParams& r = p.rows;
  r.norm = o.norm;
  r.norm_eps = o.norm_eps;
  r.norm_unit_offset = o.norm_unit_offset;
  check_like_grad_out("pre_norm", *o.pre_norm, grad_out, internal::RowIndex::pre_norm_out, p);
  p.pre_norm = o.pre_norm->data();
  p.pre_norm_dtype = o.pre_norm->dtype();
  if (o.grad_pre_norm) {
    check_like_grad_out("grad_pre_norm", *o.grad_pre_norm, grad_out,
                        internal::RowIndex::grad_pre_norm, p);
    p.grad_pre_norm = o.grad_pre_norm->data();
    p.grad_pre_norm_dtype = o.grad_pre_norm->dtype();
  }
  if (o.norm_weight) {
    check_norm_vector("norm_weight", *o.norm_weight, grad_out, false);
    r.norm_weight = o.norm_weight->data();
    r.norm_weight_dtype = o.norm_weight->dtype();
  }
  if (o.grad_norm_weight) {
    check_norm_vector("grad_norm_weight", *o.grad_norm_weight, grad_out, true);
    p.grad_norm_weight = static_cast<float*>(o.grad_norm_weight->data());
  }
  if (o.grad_norm_bias) {
    check_norm_vector("grad_norm_bias", *o.grad_norm_bias, grad_out, true);
    p.grad_norm_bias = static_cast<float*>(o.grad_norm_bias->data());
  }
}

// Validates every argument and fills the parameters of the call.
Params prepare(const Tensor& grad_out, const Tensor& ids, const std::optional<Tensor>& grad_table,
               const EmbedBackwardOptions& o) {
  validate::check_view(kOp, "ids", ids, 0, kMaxDims - 1);
  validate::check_index_dtype(kOp, "ids", ids);
  const Device device = ids.device();
  validate::check_device_usable(kOp, device);

  validate::check_view(kOp, "grad_out", grad_out, ids.ndim() + 1, ids.ndim() + 1);
  validate::check_value_dtype(kOp, "grad_out", grad_out);
  validate::check_same_device(kOp, "grad_out", grad_out, "ids", device);
  validate::check_last_contiguous(kOp, "grad_out", grad_out);
  for (int d = 0; d < ids.ndim(); ++d) {
    validate::check_dim(kOp, "grad_out", grad_out, d, ids.shape(d), "the shape of ids");
  }
  const std::int64_t dim = grad_out.shape(ids.ndim());
  if (!std::isfinite(o.scale)) fail(kOp, "scale {} must be finite", o.scale);
  if (o.mode != BackwardMode::deterministic && o.mode != BackwardMode::atomic) {
    fail(kOp, "mode {} is neither deterministic nor atomic", static_cast<int>(o.mode));
  }

  Params p;
  internal::EmbedParams& r = p.rows;
  r.dtype = grad_out.dtype();
  set_rows(ids, grad_out, r);
  r.vocab_start = o.vocab_start;
  r.vocab_shard = o.vocab_shard;
  r.scale = o.scale;
  check_vocab_start(kOp, o.vocab_start, 0);

  if (grad_table) {
    check_grad("grad_table", *grad_table, grad_out, dim, p.targets[Params::token], o.scale);
    check_vocab_start(kOp, o.vocab_start, grad_table->shape(0));
    r.vocab_size = grad_table->shape(0);
  } else {
    // No token gradient (a frozen table): ids are not read, as if every id missed a shard.
    r.vocab_start = 0;
    r.vocab_size = 0;
    r.vocab_shard = true;
  }
  if (o.padding_idx) {
    if (*o.padding_idx < 0) {
      fail(kOp,
           "padding_idx {} is negative; ids are not (a negative id is a bad index), so it would "
           "keep no row from grad_table",
           *o.padding_idx);
    }
    p.has_padding = true;
    p.padding_idx = *o.padding_idx;
  }

  if (o.grad_position_table) {
    check_grad("grad_position_table", *o.grad_position_table, grad_out, dim,
               p.targets[Params::position], 1.0f);
    r.positions = PositionEncoding::learned;
    r.max_positions = o.grad_position_table->shape(0);
    set_row_positions(kOp, ids, o.position_ids, o.position_offsets, r);
  } else if (o.position_ids || o.position_offsets) {
    fail(kOp, "position_ids or position_offsets are given but grad_position_table is not");
  }

  if (o.grad_type_table || o.type_ids) {
    if (!o.grad_type_table || !o.type_ids) fail(kOp, "grad_type_table and type_ids come together");
    check_grad("grad_type_table", *o.grad_type_table, grad_out, dim, p.targets[Params::type], 1.0f);
    set_row_types(kOp, ids, *o.type_ids, o.grad_type_table->shape(0), r);
    // Non-null marks type ids as in use for resolve_embed_row; the pointer is never read.
    r.type_table = o.grad_type_table->data();
    r.type_table_stride = o.grad_type_table->stride(0);
  }
  set_norm(grad_out, o, p);
  if (!grad_table && !o.grad_position_table && !o.grad_type_table && !o.grad_norm_weight &&
      !o.grad_norm_bias) {
    fail(kOp,
         "no gradient is given: pass grad_table, grad_position_table, grad_type_table, "
         "grad_norm_weight or grad_norm_bias");
  }

  // The gradients are written (accumulated into, or overwritten): none may share memory with
  // an input, with another gradient or with itself.
  using Named = std::pair<const char*, const std::optional<Tensor>*>;
  const Named grads[] = {{"grad_table", &grad_table},
                         {"grad_position_table", &o.grad_position_table},
                         {"grad_type_table", &o.grad_type_table},
                         {"grad_norm_weight", &o.grad_norm_weight},
                         {"grad_norm_bias", &o.grad_norm_bias}};
  const std::optional<Tensor> grad_out_view = grad_out, ids_view = ids;
  const Named inputs[] = {
      {"grad_out", &grad_out_view},      {"ids", &ids_view},
      {"position_ids", &o.position_ids}, {"position_offsets", &o.position_offsets},
      {"type_ids", &o.type_ids},         {"pre_norm", &o.pre_norm},
      {"norm_weight", &o.norm_weight},   {"grad_pre_norm", &o.grad_pre_norm}};
  constexpr std::size_t kGrads = sizeof grads / sizeof grads[0];
  for (std::size_t i = 0; i < kGrads; ++i) {
    if (!*grads[i].second) continue;
    const Tensor& g = **grads[i].second;
    validate::check_no_self_overlap(kOp, grads[i].first, g);
    for (const auto& [name, input] : inputs) {
      if (*input) validate::check_no_overlap(kOp, grads[i].first, g, name, **input);
    }
    for (std::size_t j = i + 1; j < kGrads; ++j) {
      if (*grads[j].second) {
        validate::check_no_overlap(kOp, grads[i].first, g, grads[j].first, **grads[j].second);
      }
    }
  }

  p.mode = o.mode;
  p.workspace = o.workspace;
  p.workspace_bytes = o.workspace_bytes;
  return p;
}

// Whether a call runs its kernel: rows of some width, or no rows but norm gradients (sums over
// no rows, zero). Otherwise the tables are unchanged and nothing is launched.
bool runs_kernel(const Params& p) {
  const bool norm_gradients = p.grad_norm_weight != nullptr || p.grad_norm_bias != nullptr;
  return p.rows.dim != 0 && (p.rows.rows != 0 || norm_gradients);
}

}  // namespace

void embed_backward(const Tensor& grad_out, const Tensor& ids,
                    const std::optional<Tensor>& grad_table, const EmbedBackwardOptions& o) {
  Params p = prepare(grad_out, ids, grad_table, o);
  const Device device = ids.device();
  if (!runs_kernel(p)) return;
  if (device.kind == DeviceKind::cuda && p.workspace != nullptr) {
    const std::size_t needed = gpu::embed_backward_workspace_size(p, device);
    if (p.workspace_bytes < needed) {
      fail(kOp, "workspace_bytes {} is less than the {} bytes this call needs", p.workspace_bytes,
           needed);
    }
  }
  run_kernel(kOp, device, o.stream, o.deferred, p, p.rows.bad, cpu::embed_backward,
             gpu::embed_backward);
}

std::size_t embed_backward_workspace_size(const Tensor& grad_out, const Tensor& ids,
                                          const std::optional<Tensor>& grad_table,
                                          const EmbedBackwardOptions& o) {
  const Params p = prepare(grad_out, ids, grad_table, o);
  // The call's own rule: a call that runs its kernel is checked against this size.
  if (ids.device().kind == DeviceKind::cpu || !runs_kernel(p)) return 0;
  return gpu::embed_backward_workspace_size(p, ids.device());
}

EMBROPE_END_NAMESPACE
