// Row normalisation in float32 (LayerNorm, Ba et al. 2016, arXiv:1607.06450; RMSNorm, Zhang &
// Sennrich 2019, arXiv:1910.07467), shared by the CPU and CUDA backends (docs/numerics.md,
// "Normalisation"), so that both sum in the same order and round the same way.
//
// The order of a row's sums: element j of the row goes to partial j % kNormPartials, each
// partial a float32 sum in ascending j starting from +0; the partials are then combined by
// halving, partial[m] += partial[m + h] for h = 128, 64, ..., 1, and the result is
// partial[0]. Every step is an independent float32 addition, so a CPU vector loop and the
// GPU (lane l of a row's 32 lanes owns partials 8l .. 8l + 7, loaded as one 16-byte chunk for
// 16-bit values) give the same bits. A partial never holds -0 (it starts at +0 and IEEE sums
// to zero are +0), so partials that no element reaches are exact identities.
#pragma once

#include <cmath>
#include <cstdint>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

constexpr int kNormLanes = 32;     // lanes (GPU threads) that share a row
constexpr int kNormLaneWidth = 8;  // consecutive partials (elements) of one lane
constexpr int kNormPartials = kNormLanes * kNormLaneWidth;

// The row's statistics: y = (x - mean) * rstd * weight + bias (mean 0 for rms_norm).
struct NormStats {
  float mean = 0.0f;
  float rstd = 1.0f;
};

// Combines the partials by halving (the order above); partial is overwritten.
EMBROPE_INLINE_INTO_CALLER float combine_norm_partials(float* partial) {
  for (int h = kNormPartials / 2; h >= 1; h /= 2) {
    for (int m = 0; m < h; ++m) partial[m] += partial[m + h];
  }
  return partial[0];
}

// The sum over j < n of term(j), in the order above (the CPU's form; term is a float32 value).
template <typename Term>
EMBROPE_INLINE_INTO_CALLER float canonical_row_sum(std::int64_t n, Term term) {
  float partial[kNormPartials] = {};
  for (std::int64_t base = 0; base < n; base += kNormPartials) {
    const int count = n - base < kNormPartials ? static_cast<int>(n - base) : kNormPartials;
    for (int m = 0; m < count; ++m) partial[m] += term(base + m);
  }
  return combine_norm_partials(partial);
}

// Forward declarations for row_norm_stats (defined below).
EMBROPE_HD float norm_mean(float sum, std::int64_t dim);
EMBROPE_HD float norm_square_term(float x, float mean);
EMBROPE_HD float norm_rstd(float sum_squares, std::int64_t dim, float eps);

// mean = sum / D, correctly rounded.
EMBROPE_HD float norm_mean(float sum, std::int64_t dim) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(sum, static_cast<float>(dim));
#else
  return sum / static_cast<float>(dim);
#endif
}

// One term of the second sum: (x - mean)^2, the difference and the square each rounded (for
// rms_norm mean is 0 and x - 0 is x).
EMBROPE_HD float norm_square_term(float x, float mean) {
#if defined(__CUDA_ARCH__)
  const float d = __fsub_rn(x, mean);
  return __fmul_rn(d, d);
#else
  const float d = x - mean;
  return d * d;
#endif
}

// rstd = 1 / sqrt(sum_squares / D + eps), each step correctly rounded in float32 (sqrtf is
// IEEE-rounded on the GPU unless built with -prec-sqrt=false or fast math, which embrope is
// not; not rsqrtf, which is approximate).
EMBROPE_HD float norm_rstd(float sum_squares, std::int64_t dim, float eps) {
#if defined(__CUDA_ARCH__)
  const float var = __fdiv_rn(sum_squares, static_cast<float>(dim));
  return __fdiv_rn(1.0f, sqrtf(__fadd_rn(var, eps)));
#else
  const float var = sum_squares / static_cast<float>(dim);
  return 1.0f / std::sqrt(var + eps);
#endif
}

// The normalised value ((x - mean) * rstd) * weight + bias, every step rounded (weight is
// already 1 + w for unit-offset weights; absent weight and bias are 1 and 0).
EMBROPE_HD float norm_apply(float x, NormStats s, float weight, float bias) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x, s.mean), s.rstd), weight), bias);
#else
  return (x - s.mean) * s.rstd * weight + bias;
#endif
}

// The weight factor of element j from the stored weight w: w, or 1 + w (Gemma's unit offset).
EMBROPE_HD float norm_weight_factor(float w, bool unit_offset) {
#if defined(__CUDA_ARCH__)
  return unit_offset ? __fadd_rn(1.0f, w) : w;
#else
  return unit_offset ? 1.0f + w : w;
#endif
}

// ------------------------------------------------ qk-norm (apply_qk_norm_rope) ----
// RMSNorm of each (token, head) row of q and k over the head dim D, as Qwen3 and Gemma 3 do it
// before RoPE: n_j = (x_j * rstd) * w_j with rstd = norm_rstd(sum_j x_j^2, D, eps); then the
// rotation of the pairs of n, rounded once. Its gradient, for g the gradient of n (the output's
// gradient rotated back) and u_j = w_j * g_j, xhat_j = x_j * rstd:
//   dx_j = rstd * u_j - xhat_j * c,   c = (sum_i u_i * xhat_i / D) * rstd
//   dw_j = sum over rows of g_j * xhat_j
// (d rstd / d x_i = -rstd^3 x_i / D). Each step is rounded in float32; the sums take the order
// above.

// xhat = x * rstd, the normalised value before the weight.
EMBROPE_HD float rms_normalized(float x, float rstd) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, rstd);
#else
  return x * rstd;
#endif
}

// The product of two rounded values, rounded (a term of the backward's sums, or u = w * g).
EMBROPE_HD float norm_product(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// c = (sum_u_xhat / D) * rstd, the factor of xhat in dx.
EMBROPE_HD float rms_backward_factor(float sum_u_xhat, std::int64_t dim, float rstd) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__fdiv_rn(sum_u_xhat, static_cast<float>(dim)), rstd);
#else
  return sum_u_xhat / static_cast<float>(dim) * rstd;
#endif
}

// dx = rstd * u - xhat * c.
EMBROPE_HD float rms_backward_value(float u, float xhat, float rstd, float c) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__fmul_rn(rstd, u), __fmul_rn(xhat, c));
#else
  return rstd * u - xhat * c;
#endif
}

// The weight gradient's deterministic order: the rows of q (of k), in their flat (token, head)
// order, are cut into chunks of kWeightGradRows; a chunk's partial sums its rows in ascending
// order from +0, and dw_j sums the chunk partials in ascending order from +0. Both backends.
// embed_backward's norm weight and bias gradients take the same order over the rows of ids.
constexpr std::int64_t kWeightGradRows = 64;

// The chunks of kWeightGradRows rows that `rows` rows make.
EMBROPE_HD std::int64_t weight_grad_chunks(std::int64_t rows) {
  return (rows + kWeightGradRows - 1) / kWeightGradRows;
}

// ------------------------------------------ embed's norm backward (embed_backward) ----
// The gradient of embed's LayerNorm / RMSNorm y_j = xhat_j * w_j + b_j, xhat_j = (x_j - mean)
// * rstd, from the pre-norm row x and the output's gradient g (torch's native_layer_norm
// backward, written as for the qk-norm above), with u_j = w_j * g_j:
//   dx_j = rstd * u_j - xhat_j * c - e,   c = (sum_i u_i * xhat_i / D) * rstd,
//                                          e = (sum_i u_i / D) * rstd  (0 for rms_norm)
//   dw_j = sum over rows of g_j * xhat_j,  db_j = sum over rows of g_j
// (d mean / d x_i = 1 / D and d rstd / d x_i = -rstd^3 (x_i - mean) / D). e is the term the
// mean adds; c and e are both rms_backward_factor of their sums. Each step is rounded in
// float32; the row sums take the canonical order, the weight sums the chunk order above.

// xhat = (x - mean) * rstd (for rms_norm, mean is 0 and this is rms_normalized's x * rstd).
EMBROPE_HD float norm_normalized(float x, NormStats s) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__fsub_rn(x, s.mean), s.rstd);
#else
  return (x - s.mean) * s.rstd;
#endif
}

// dx = (rstd * u - xhat * c) - e, plus the gradient the pre-norm row receives directly.
EMBROPE_HD float norm_backward_value(float u, float xhat, float rstd, float c, float e,
                                     float grad_pre) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fsub_rn(rms_backward_value(u, xhat, rstd, c), e), grad_pre);
#else
  return rms_backward_value(u, xhat, rstd, c) - e + grad_pre;
#endif
}

// The statistics of a float32 row a[0 .. dim) (the CPU's form): the mean (layer_norm; 0 for
// rms_norm) and rstd, with the sums in the order above.
EMBROPE_INLINE_INTO_CALLER NormStats row_norm_stats(const float* a, std::int64_t dim,
                                                    bool layer_norm, float eps) {
  NormStats s;
  if (layer_norm) {
    s.mean = norm_mean(canonical_row_sum(dim, [a](std::int64_t j) { return a[j]; }), dim);
  }
  const float mean = s.mean;
  s.rstd = norm_rstd(
      canonical_row_sum(dim, [a, mean](std::int64_t j) { return norm_square_term(a[j], mean); }),
      dim, eps);
  return s;
}

}  // namespace embrope::detail
