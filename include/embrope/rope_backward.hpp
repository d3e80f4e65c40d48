// apply_rope_backward: the gradient of apply_rope with respect to q and k (DESIGN.md 3.6).
#pragma once

#include "embrope/detail/export.hpp"

#include <optional>

#include "embrope/rope.hpp"
#include "embrope/rope_cache.hpp"
#include "embrope/tensor.hpp"

namespace embrope {

// RoPE is a linear map per token and pair, y = m R(theta) x, with R a rotation and m the
// attention factor folded into the cos/sin table. Its gradient is the transpose,
// dx = m R(theta)^T dy = m R(-theta) dy: the same rotation with -sin, which is what this
// computes, in one launch for dq and dk, in place by default.
//
// dq and dk (optional) are the gradients of the forward's outputs, shaped like its q and k;
// positions, the table (cache, or cos and sin) and options are those of the forward call.
// options.inverse names the forward's direction: a forward with inverse = true rotated by
// -theta, so its gradient rotates by +theta. options.q_out / k_out, when given, receive the
// gradients out of place (elements at and past rotary_dim are copied: their gradient passes
// through); absent, dq and dk are overwritten. Positions outside the table zero-fill their
// token's rows and are reported as apply_rope's are (status.hpp; a deferred record names
// apply_rope). Argument errors name apply_rope_backward.
EMBROPE_EXPORT void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                        const Tensor& positions, const RopeCache& cache,
                                        const RopeOptions& options = {});

// The same with a caller-supplied table: cos and sin [max_positions, rotary_dim / 2], as in
// apply_rope.
EMBROPE_EXPORT void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk,
                                        const Tensor& positions, const Tensor& cos,
                                        const Tensor& sin, const RopeOptions& options = {});

}  // namespace embrope
