// apply_rope_backward: apply_rope with the rotation transposed (options.inverse flipped).
// The forward's validation and kernels serve it, speaking of dq and dk; its kernels already
// rotate by -theta when asked (docs/ops.md, "apply_rope_backward").
#include "apply_rope.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE
namespace {

RopeOptions transposed(const RopeOptions& options) {
  RopeOptions o = options;
  o.inverse = !options.inverse;
  return o;
}

}  // namespace

void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& positions,
                         const RopeCache& cache, const RopeOptions& options) {
  internal::apply_rope_named(internal::kRopeBackwardNames, dq, dk, positions, cache,
                             transposed(options));
}

void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& positions,
                         const Tensor& cos, const Tensor& sin, const RopeOptions& options) {
  internal::apply_rope_named(internal::kRopeBackwardNames, dq, dk, positions, cos, sin,
                             transposed(options));
}

EMBROPE_END_NAMESPACE
