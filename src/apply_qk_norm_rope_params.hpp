// apply_qk_norm_rope's parameters: RoPE's, with the per-head RMSNorm's weights
// (apply_rope_params.hpp says how parameters are made and used).
#pragma once

#include <cstddef>
#include <cstdint>

#include "apply_rope_params.hpp"
#include "embrope/detail/config.hpp"
#include "embrope/detail/norm_math.hpp"

namespace embrope::internal {

// The per-head RMSNorm of q and k rows (apply_qk_norm_rope, apply_qk_norm_rope_append_kv).
struct QkNormWeights {
  // [D] weights, null when absent (1).
  const void* q_weight = nullptr;
  const void* k_weight = nullptr;
  DType q_weight_dtype = DType::float32, k_weight_dtype = DType::float32;
  float eps = 0.0f;
  bool unit_offset = false;
};

struct QkNormRopeParams {
  // The rotation and its rows. Forward: rope.q.in is q, rope.q.out the output. Backward:
  // rope.q.in is dq (the output's gradient), rope.q.out the input's gradient, and rope.inverse
  // already transposed (the rotation dq is turned by).
  RopeParams rope;
  QkNormWeights norm;
  // Backward: the forward's inputs (in and the strides; out unused) and the weight gradients
  // ([D] float32, null when not requested).
  RopeHeads saved_q, saved_k;
  float* q_weight_grad = nullptr;
  float* k_weight_grad = nullptr;
  void* workspace = nullptr;  // CUDA, with a weight gradient; null: allocate on the stream
  std::size_t workspace_bytes = 0;
};

// The weight factor of element j of a q (is_q) or k row: 1, w_j, or 1 + w_j.
EMBROPE_HD float qk_norm_weight(const QkNormWeights& n, bool is_q, std::int64_t j) {
  const void* w = is_q ? n.q_weight : n.k_weight;
  if (w == nullptr) return 1.0f;
  return detail::norm_weight_factor(
      load_vector_value(w, is_q ? n.q_weight_dtype : n.k_weight_dtype, j), n.unit_offset);
}

// The saved forward input of head h of token (b, s) of q (is_q) or k.
template <typename T>
EMBROPE_HD const T* qk_saved_row(const QkNormRopeParams& p, bool is_q, std::int64_t b,
                                 std::int64_t s, std::int64_t h) {
  const RopeHeads& x = is_q ? p.saved_q : p.saved_k;
  return static_cast<const T*>(x.in) + b * x.in_stride_b + s * x.in_stride_s + h * x.in_stride_h;
}

}  // namespace embrope::internal
