// apply_qk_norm_rope: RMSNorm of each head of q and k, then RoPE, in one pass (docs/ops.md,
// "apply_qk_norm_rope"), and apply_qk_norm_rope_backward, its gradient.
#pragma once

#include <cstddef>
#include <optional>

#include "embrope/apply_rope.hpp"
#include "embrope/export.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/tensor.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// The per-head RMSNorm of q and k (Qwen3's q_norm / k_norm, Gemma 3's): each (token, head)
// row x of length head_dim becomes x / sqrt(mean(x^2) + eps) * w, in float32.
struct QkNorm {
  // [head_dim] weights of q's and of k's norm, contiguous, float32 or q's dtype, on q's
  // device. Absent: 1. A k_weight needs k.
  std::optional<Tensor> q_weight;
  std::optional<Tensor> k_weight;
  // Finite and >= 0. With 0 an all-zero row gives NaN, as in PyTorch.
  float eps = 1e-6f;
  // The weight applied is 1 + w (Gemma's RMSNorm); needs the weights it offsets.
  bool unit_offset = false;
};

// Normalises every head row of q [T, Hq, D] or [B, S, Hq, D] and, when given, of k (Hk heads,
// GQA/MQA) over D with norm's weights, then rotates the normalised rows as apply_rope does
// (every RopeOptions field applies: layout, partial rotary, mrope, q_out / k_out, the
// bad-index policy). The norm covers the whole head dim; elements at and past rotary_dim are
// normalised and not rotated. Arithmetic is float32 with one rounding to the output dtype; a
// row's sum of squares takes the order of docs/numerics.md on both backends. A position
// outside the table zero-fills its token's rows and is reported (deferred_status.hpp).
EMBROPE_EXPORT void apply_qk_norm_rope(const Tensor& q, const std::optional<Tensor>& k,
                                       const Tensor& positions, const RopeCache& cache,
                                       const QkNorm& norm, const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin [max_positions, rotary_dim / 2].
EMBROPE_EXPORT void apply_qk_norm_rope(const Tensor& q, const std::optional<Tensor>& k,
                                       const Tensor& positions, const Tensor& cos,
                                       const Tensor& sin, const QkNorm& norm,
                                       const RopeOptions& options = {});

// ------------------------------------------------------ apply_qk_norm_rope_backward ----

// Where the weight gradients go. Each is [head_dim] float32, contiguous, on q's device, and
// is overwritten with dL/dw summed over every row of q (of k) in a fixed order, the same on
// the CPU and the GPU (docs/numerics.md): run-to-run and backend-to-backend identical.
struct QkNormGradients {
  std::optional<Tensor> q_weight;  // needs QkNorm::q_weight
  std::optional<Tensor> k_weight;  // needs QkNorm::k_weight
  // CUDA, with a weight gradient: device memory of at least
  // apply_qk_norm_rope_backward_workspace_size() bytes for the per-chunk partial sums.
  // Null: the call allocates it on its stream.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// The gradient of apply_qk_norm_rope. dq and dk (optional) are the gradients of its outputs;
// q and k are its inputs (saved: the norm's statistics are recomputed from them, in the
// forward's order); positions, the table, norm and options are the forward call's
// (options.inverse names the forward's direction). The input gradients overwrite dq and dk,
// or go to options.q_out / k_out; grads receives the weight gradients. Positions outside the
// table zero-fill their token's gradient rows, add nothing to the weight gradients and are
// reported. Errors name apply_qk_norm_rope_backward.
EMBROPE_EXPORT void apply_qk_norm_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                                const Tensor& q, const std::optional<Tensor>& k,
                                                const Tensor& positions, const RopeCache& cache,
                                                const QkNorm& norm, const QkNormGradients& grads,
                                                const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin [max_positions, rotary_dim / 2].
EMBROPE_EXPORT void apply_qk_norm_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                                const Tensor& q, const std::optional<Tensor>& k,
                                                const Tensor& positions, const Tensor& cos,
                                                const Tensor& sin, const QkNorm& norm,
                                                const QkNormGradients& grads,
                                                const RopeOptions& options = {});

// Bytes of workspace the backward needs for gradients of these shapes: nonzero only for CUDA
// tensors with a weight gradient requested (one float32 partial per chunk of 64 rows and
// element of the head dim, q's and k's).
EMBROPE_EXPORT std::size_t apply_qk_norm_rope_backward_workspace_size(
    const Tensor& dq, const std::optional<Tensor>& dk, const QkNormGradients& grads);

EMBROPE_END_NAMESPACE
