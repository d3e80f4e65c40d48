// The summation order and rounding of embed_backward, shared by the CPU and CUDA backends
// (docs/numerics.md), so that both backends sum in the same order and round the same way.
#pragma once

#include <cstdint>

#include "embrope/detail/config.hpp"

namespace embrope::detail {

// The rows of one table row's sum are added in chunks of this many grad_out rows (in
// ascending row order): each chunk is summed from zero, then the chunk sums are added in
// chunk order. The GPU splits a long run (one frequent token) across warps at these chunk
// boundaries; the CPU sums in the same order, so that both give the same bits. Fixed, not a
// launch parameter: the order, hence the result, does not depend on the launch.
constexpr std::int64_t kEmbedBackwardChunk = 32;

// The value written to a gradient element: existing + weight * sum, in float32, with the
// product rounded before the addition on both backends (nvcc would otherwise fuse it into
// an FMA on the GPU only).
EMBROPE_HD float accumulate_gradient(float existing, float sum, float weight) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(existing, __fmul_rn(weight, sum));
#else
  return existing + weight * sum;
#endif
}

}  // namespace embrope::detail
