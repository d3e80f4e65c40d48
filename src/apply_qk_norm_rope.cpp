// apply_qk_norm_rope and its backward: apply_rope's validation (prepare_rope, speaking of
// the op's own names), the norm's weights, eps and gradients, then the CPU or CUDA kernel.
#include "embrope/apply_qk_norm_rope.hpp"
#include "embrope/version.hpp"

#include <cmath>

#include "apply_rope.hpp"
#include "backend.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

using internal::check_apart_from_table;
using internal::CosSinTable;
using internal::QkNormRopeParams;
using internal::RopeNames;
using validate::fail;

// The row view of q or k (in and strides; out unused), as RopeParams holds its rows.
internal::RopeHeads saved_heads(const Tensor& x) {
  const int n = x.ndim();
  internal::RopeHeads heads;
  heads.in = x.data();
  heads.heads = x.shape(n - 2);
  heads.in_stride_h = x.stride(n - 2);
  heads.in_stride_s = x.stride(n - 3);
  heads.in_stride_b = n == 4 ? x.stride(0) : 0;
  return heads;
}

// A [D] weight (float32 or q's dtype) or weight gradient (float32), contiguous, on q's device.
void check_norm_vector(const char* op, const char* name, const Tensor& t, const Tensor& q,
                       bool gradient) {
  validate::check_view(op, name, t, 1, 1);
  validate::check_same_device(op, name, t, "q", q.device());
  if (gradient) {
    validate::check_same_dtype(op, name, t, "a weight gradient", DType::float32);
  } else {
    validate::check_float32_or_dtype(op, name, t, "q", q.dtype());
  }
  validate::check_last_contiguous(op, name, t);
  validate::check_dim(op, name, t, 0, q.shape(q.ndim() - 1), "head_dim of q");
}

// The outputs of the call (q's rows, then k's, as options place them).
struct Outputs {
  const Tensor* tensors[2] = {nullptr, nullptr};
  const char* names[2] = {nullptr, nullptr};
};
Outputs outputs_of(const RopeNames& names, const Tensor& q, const std::optional<Tensor>& k,
                   const RopeOptions& options) {
  Outputs o;
  o.tensors[0] = options.q_out ? &*options.q_out : &q;
  o.names[0] = options.q_out ? names.q_out : names.q;
  if (k) {
    o.tensors[1] = options.k_out ? &*options.k_out : &*k;
    o.names[1] = options.k_out ? names.k_out : names.k;
  }
  return o;
}

// No output shares memory with `in` (a weight, a saved input, a weight gradient).
void check_outputs_apart(const char* op, const Outputs& outputs, const char* name,
                         const Tensor& in) {
  for (int i = 0; i < 2 && outputs.tensors[i] != nullptr; ++i) {
    validate::check_no_overlap(op, outputs.names[i], *outputs.tensors[i], name, in);
  }
}

QkNormRopeParams prepare_forward(const Tensor& q, const std::optional<Tensor>& k,
                                 const Tensor& positions, const CosSinTable& table,
                                 const QkNorm& norm, const RopeOptions& options) {
  const RopeNames& names = internal::kQkNormRopeNames;
  QkNormRopeParams p;
  p.rope = internal::prepare_rope(names, q, k, positions, table, options);
  p.norm = internal::prepare_qk_norm(names.op, q, k, norm);
  const Outputs outputs = outputs_of(names, q, k, options);
  if (norm.q_weight) check_outputs_apart(names.op, outputs, "q_weight", *norm.q_weight);
  if (norm.k_weight) check_outputs_apart(names.op, outputs, "k_weight", *norm.k_weight);
  return p;
}

// The saved forward input `x` (q or k) beside its gradient `dx` (dq or dk): same shape,
// dtype and device, last dimension contiguous.
void check_saved(const char* op, const char* name, const Tensor& x, const char* grad_name,
                 const Tensor& dx) {
  validate::check_view(op, name, x, dx.ndim(), dx.ndim());
  validate::check_same_device(op, name, x, grad_name, dx.device());
  validate::check_same_dtype(op, name, x, grad_name, dx.dtype());
  validate::check_last_contiguous(op, name, x);
  for (int d = 0; d < dx.ndim(); ++d) {
    if (x.shape(d) != dx.shape(d)) {
      fail(op, "{} has shape {} but {} has {}; they must match", name, validate::shape_string(x),
           grad_name, validate::shape_string(dx));
    }
  }
}

QkNormRopeParams prepare_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                  const Tensor& q, const std::optional<Tensor>& k,
                                  const Tensor& positions, const CosSinTable& table,
                                  const QkNorm& norm, const QkNormGradients& grads,
                                  const RopeOptions& options) {
  const RopeNames& names = internal::kQkNormRopeBackwardNames;
  const char* op = names.op;
  RopeOptions transposed = options;
  transposed.inverse = !options.inverse;
  QkNormRopeParams p;
  p.rope = internal::prepare_rope(names, dq, dk, positions, table, transposed);
  check_saved(op, "q", q, "dq", dq);
  if (dk && !k) fail(op, "dk is given but k (the forward's saved k) is not");
  if (k && !dk) fail(op, "k is given but dk is not");
  if (k) check_saved(op, "k", *k, "dk", *dk);
  p.norm = internal::prepare_qk_norm(op, q, k, norm);
  p.saved_q = saved_heads(q);
  if (k) p.saved_k = saved_heads(*k);

  if (grads.q_weight) {
    if (!norm.q_weight) fail(op, "grads.q_weight is given but norm.q_weight is not");
    check_norm_vector(op, "grads.q_weight", *grads.q_weight, q, true);
    p.q_weight_grad = static_cast<float*>(grads.q_weight->data());
  }
  if (grads.k_weight) {
    if (!norm.k_weight) fail(op, "grads.k_weight is given but norm.k_weight is not");
    check_norm_vector(op, "grads.k_weight", *grads.k_weight, q, true);
    p.k_weight_grad = static_cast<float*>(grads.k_weight->data());
  }
  p.workspace = grads.workspace;
  p.workspace_bytes = grads.workspace_bytes;

  // The input gradients are written while q, k, the weights and the other gradients are read
  // or written; the weight gradients while everything else is read.
  const Outputs outputs = outputs_of(names, dq, dk, options);
  check_outputs_apart(op, outputs, "q", q);
  if (k) check_outputs_apart(op, outputs, "k", *k);
  if (norm.q_weight) check_outputs_apart(op, outputs, "q_weight", *norm.q_weight);
  if (norm.k_weight) check_outputs_apart(op, outputs, "k_weight", *norm.k_weight);
  const std::optional<Tensor>* weight_grads[2] = {&grads.q_weight, &grads.k_weight};
  const char* weight_grad_names[2] = {"grads.q_weight", "grads.k_weight"};
  for (int i = 0; i < 2; ++i) {
    if (!*weight_grads[i]) continue;
    const Tensor& g = **weight_grads[i];
    const char* name = weight_grad_names[i];
    check_outputs_apart(op, outputs, name, g);
    const std::pair<const char*, const Tensor*> inputs[] = {{"dq", &dq}, {"q", &q}};
    for (const auto& [in_name, in] : inputs) validate::check_no_overlap(op, name, g, in_name, *in);
    if (dk) validate::check_no_overlap(op, name, g, "dk", *dk);
    if (k) validate::check_no_overlap(op, name, g, "k", *k);
    if (norm.q_weight) validate::check_no_overlap(op, name, g, "q_weight", *norm.q_weight);
    if (norm.k_weight) validate::check_no_overlap(op, name, g, "k_weight", *norm.k_weight);
    validate::check_no_overlap(op, name, g, "positions", positions);
    check_apart_from_table(op, name, g, table);
  }
  if (grads.q_weight && grads.k_weight) {
    validate::check_no_overlap(op, "grads.q_weight", *grads.q_weight, "grads.k_weight",
                               *grads.k_weight);
  }
  return p;
}

bool no_rows(const QkNormRopeParams& p) {
  return p.rope.batch * p.rope.seq == 0 ||
         p.rope.q.heads + (p.rope.has_k ? p.rope.k.heads : 0) == 0;
}

void forward(const Tensor& q, const std::optional<Tensor>& k, const Tensor& positions,
             const CosSinTable& table, const QkNorm& norm, const RopeOptions& options) {
  QkNormRopeParams p = prepare_forward(q, k, positions, table, norm, options);
  if (no_rows(p)) return;
  run_kernel(internal::kQkNormRopeNames.op, q.device(), options.stream, options.deferred, p,
             p.rope.bad, cpu::apply_qk_norm_rope, gpu::apply_qk_norm_rope);
}

void backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& q,
              const std::optional<Tensor>& k, const Tensor& positions, const CosSinTable& table,
              const QkNorm& norm, const QkNormGradients& grads, const RopeOptions& options) {
  QkNormRopeParams p = prepare_backward(dq, dk, q, k, positions, table, norm, grads, options);
  const char* op = internal::kQkNormRopeBackwardNames.op;
  const Device device = dq.device();
  if (device.kind == DeviceKind::cuda && p.workspace != nullptr) {
    const std::size_t needed = gpu::apply_qk_norm_rope_backward_workspace_size(p, device);
    if (p.workspace_bytes < needed) {
      fail(op, "grads.workspace_bytes {} is less than the {} bytes this call needs",
           p.workspace_bytes, needed);
    }
  }
  // No rows: nothing to normalise, and the weight gradients (sums over no rows) are zero.
  run_kernel(op, device, options.stream, options.deferred, p, p.rope.bad,
             cpu::apply_qk_norm_rope_backward, gpu::apply_qk_norm_rope_backward);
}

}  // namespace

EMBROPE_END_NAMESPACE

namespace embrope::internal {

QkNormWeights prepare_qk_norm(const char* op, const Tensor& q, const std::optional<Tensor>& k,
                              const QkNorm& norm) {
  if (!(std::isfinite(norm.eps) && norm.eps >= 0.0f)) {
    fail(op, "eps {} must be finite and >= 0", norm.eps);
  }
  if (norm.k_weight && !k) fail(op, "k_weight is given but k is not");
  if (norm.unit_offset && !norm.q_weight && !norm.k_weight) {
    fail(op, "unit_offset is set without q_weight or k_weight (the weight applied is 1 + w)");
  }
  if (norm.unit_offset && (!norm.q_weight || (k && !norm.k_weight))) {
    fail(op, "unit_offset is set but {} is absent (the weight applied is 1 + w for both)",
         norm.q_weight ? "k_weight" : "q_weight");
  }
  QkNormWeights w;
  if (norm.q_weight) {
    check_norm_vector(op, "q_weight", *norm.q_weight, q, false);
    w.q_weight = norm.q_weight->data();
    w.q_weight_dtype = norm.q_weight->dtype();
  }
  if (norm.k_weight) {
    check_norm_vector(op, "k_weight", *norm.k_weight, q, false);
    w.k_weight = norm.k_weight->data();
    w.k_weight_dtype = norm.k_weight->dtype();
  }
  w.eps = norm.eps;
  w.unit_offset = norm.unit_offset;
  return w;
}

}  // namespace embrope::internal

EMBROPE_BEGIN_NAMESPACE

void apply_qk_norm_rope(const Tensor& q, const std::optional<Tensor>& k, const Tensor& positions,
                        const RopeCache& cache, const QkNorm& norm, const RopeOptions& options) {
  forward(q, k, positions, internal::cos_sin_table(internal::kQkNormRopeNames.op, cache), norm,
          options);
}

void apply_qk_norm_rope(const Tensor& q, const std::optional<Tensor>& k, const Tensor& positions,
                        const Tensor& cos, const Tensor& sin, const QkNorm& norm,
                        const RopeOptions& options) {
  forward(q, k, positions, internal::cos_sin_table(internal::kQkNormRopeNames, cos, sin), norm,
          options);
}

void apply_qk_norm_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& q,
                                 const std::optional<Tensor>& k, const Tensor& positions,
                                 const RopeCache& cache, const QkNorm& norm,
                                 const QkNormGradients& grads, const RopeOptions& options) {
  backward(dq, dk, q, k, positions,
           internal::cos_sin_table(internal::kQkNormRopeBackwardNames.op, cache), norm, grads,
           options);
}

void apply_qk_norm_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& q,
                                 const std::optional<Tensor>& k, const Tensor& positions,
                                 const Tensor& cos, const Tensor& sin, const QkNorm& norm,
                                 const QkNormGradients& grads, const RopeOptions& options) {
  backward(dq, dk, q, k, positions,
           internal::cos_sin_table(internal::kQkNormRopeBackwardNames, cos, sin), norm, grads,
           options);
}

std::size_t apply_qk_norm_rope_backward_workspace_size(const Tensor& dq,
                                                       const std::optional<Tensor>& dk,
                                                       const QkNormGradients& grads) {
  const char* op = internal::kQkNormRopeBackwardNames.op;
  validate::check_view(op, "dq", dq, 3, 4);
  if (dk) validate::check_view(op, "dk", *dk, dq.ndim(), dq.ndim());
  if (dq.device().kind == DeviceKind::cpu || (!grads.q_weight && !grads.k_weight)) return 0;
  const int n = dq.ndim();
  QkNormRopeParams p;
  p.rope.batch = n == 4 ? dq.shape(0) : 1;
  p.rope.seq = dq.shape(n - 3);
  p.rope.head_dim = dq.shape(n - 1);
  p.rope.q.heads = dq.shape(n - 2);
  p.rope.has_k = dk.has_value();
  if (dk) p.rope.k.heads = dk->shape(n - 2);
  // Only whether a gradient is requested matters to the size.
  static float marker = 0.0f;
  if (grads.q_weight) p.q_weight_grad = &marker;
  if (grads.k_weight) p.k_weight_grad = &marker;
  return gpu::apply_qk_norm_rope_backward_workspace_size(p, dq.device());
}

EMBROPE_END_NAMESPACE
